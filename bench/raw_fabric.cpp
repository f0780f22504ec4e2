#include "raw_fabric.hpp"
