// A fixture of check_layers_catches_violations: the SDK including the daemon.
#include "daemon/memory/shared_buffer.h"
#include "plan/op_plan.h"
