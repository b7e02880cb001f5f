// A fixture of check_layers_catches_violations: a relative include.
#include "../client/include/collectived/dtype.h"
