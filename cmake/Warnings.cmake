# collectived_warnings: an interface target carrying the project's warning flags.
add_library(collectived_warnings INTERFACE)
target_compile_options(collectived_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
if(COLLECTIVED_WERROR)
  target_compile_options(collectived_warnings INTERFACE -Werror)
endif()
