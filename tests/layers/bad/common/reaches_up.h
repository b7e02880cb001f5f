// A fixture of check_layers_catches_violations: common/ reaching into the daemon.
#include "daemon/core/engine.h"
