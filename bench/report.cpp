#include "report.hpp"
// Stub: helper A fills this in.
