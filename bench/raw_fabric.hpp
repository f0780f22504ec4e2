// Stub: helper A fills this in (the raw-libfabric baseline: initiator loop and progress-only target).
#pragma once
