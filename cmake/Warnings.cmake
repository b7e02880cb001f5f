# collectived_warnings: an interface target carrying the project's warning flags.
add_library(collectived_warnings INTERFACE)
# Options structs are filled with designated initializers that skip fields
# on purpose; GCC would warn about each skipped field.
target_compile_options(collectived_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter
  -Wno-missing-field-initializers)
if(COLLECTIVED_WERROR)
  target_compile_options(collectived_warnings INTERFACE -Werror)
endif()
