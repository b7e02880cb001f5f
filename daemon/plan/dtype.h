// The element types; defined in the public SDK header so the daemon and the
// SDK share one definition.
#ifndef COLLECTIVED_DAEMON_PLAN_DTYPE_H_
#define COLLECTIVED_DAEMON_PLAN_DTYPE_H_

#include "../../client/include/collectived/dtype.h"

#endif  // COLLECTIVED_DAEMON_PLAN_DTYPE_H_
