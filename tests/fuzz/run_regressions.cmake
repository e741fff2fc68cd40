# Runs a harness on every committed regression input of DIR (inputs that once crashed or hung it;
# each must now be refused cleanly). -runs=1 per file: libFuzzer executes the files given, nothing else.
file(GLOB inputs "${DIR}/*")
foreach(input IN LISTS inputs)
  execute_process(COMMAND ${HARNESS} -timeout=5 ${input} RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "regression ${input}: exit ${rc}\n${err}")
  endif()
endforeach()
list(LENGTH inputs count)
message(STATUS "${DIR}: ${count} regression inputs refused cleanly")
