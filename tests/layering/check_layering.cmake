# The floors of src/ (ARCHITECTURE.md): a room may include headers of the rooms listed for it and
# no other osprey room; its library may link only those rooms' libraries. Rooms above model
# (model, engine, server, tokenizer, bench, eval, cli) are not listed: they may use what is below.
# Run by ctest (layering_includes): cmake -DSOURCE_DIR=<src> -DLINKS_osprey_<room>=a,b -P this.
cmake_minimum_required(VERSION 3.25)  # IN_LIST and the other policies of the project
set(rooms core config dist ops kv)
set(allowed_core core)
set(allowed_config core config)
set(allowed_dist core dist)
set(allowed_ops core config dist ops)
set(allowed_kv core config dist ops kv)
# Every osprey room, so that `#include "x/..."` is recognised as one of ours (not a system header).
set(all_rooms core config dist ops kv model engine server tokenizer bench eval cli)

get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)
if(NOT IS_DIRECTORY "${SOURCE_DIR}")
  message(FATAL_ERROR "layering: SOURCE_DIR '${SOURCE_DIR}' is not a folder")
endif()
string(REPLACE ";" "|" any_room "${all_rooms}")
set(errors "")
set(checked 0)
foreach(room IN LISTS rooms)
  string(REPLACE ";" ", " may "${allowed_${room}}")
  if(NOT IS_DIRECTORY "${SOURCE_DIR}/${room}")
    string(APPEND errors "  src/${room}/ is missing (the table in check_layering.cmake is stale)\n")
    continue()
  endif()
  file(GLOB_RECURSE files RELATIVE "${SOURCE_DIR}"
       "${SOURCE_DIR}/${room}/*.h" "${SOURCE_DIR}/${room}/*.cpp" "${SOURCE_DIR}/${room}/*.cu"
       "${SOURCE_DIR}/${room}/*.cuh")
  foreach(f IN LISTS files)
    math(EXPR checked "${checked} + 1")
    file(STRINGS "${SOURCE_DIR}/${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<](${any_room})/")
    foreach(line IN LISTS lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([a-z_]+)/.*" "\\1" to "${line}")
      if(NOT to IN_LIST allowed_${room})
        string(STRIP "${line}" line)
        string(APPEND errors "  src/${f}: ${line}  (src/${room} may include only: ${may})\n")
      endif()
    endforeach()
  endforeach()

  # The library's link closure (tests/layering/CMakeLists.txt computes it at configure time).
  if(NOT DEFINED LINKS_osprey_${room})
    string(APPEND errors "  no link closure was given for osprey_${room}\n")
    continue()
  endif()
  string(REPLACE "," ";" links "${LINKS_osprey_${room}}")
  foreach(lib IN LISTS links)
    string(REGEX REPLACE "^osprey_" "" to "${lib}")
    if(NOT to IN_LIST allowed_${room})
      string(APPEND errors "  osprey_${room} links ${lib}  (it may link only the libraries of: ${may})\n")
    endif()
  endforeach()
endforeach()

if(checked EQUAL 0)
  message(FATAL_ERROR "layering: no source files found under ${SOURCE_DIR}")
endif()
if(errors)
  message(FATAL_ERROR "layering: a lower room reaches above its floor (ARCHITECTURE.md: ops and kv "
                      "sit below model; ModelConfig is config/model_config.h):\n${errors}"
                      "Move what the lower room needs down a floor (src/config, src/core) instead.")
endif()
string(REPLACE ";" ", " rooms_text "${rooms}")
message(STATUS "layering: ${checked} files of src/{${rooms_text}} include and link only their floors")
