// Not compiled: the engine never sees the wire format (check_layers.py must
// find both includes).
#include "collectived/v1/collective.pb.h"
#include "plan/wire_plan.h"
