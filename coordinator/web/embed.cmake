# Writes OUT, a C++ file defining muster::web::<name> for each static file of
# the status page, from their text (cmake -P, run at build time).
#   cmake -DSRC=<dir> -DOUT=<file> -P embed.cmake
set(_assets "index.html\;kIndexHtml" "login.html\;kLoginHtml" "app.js\;kAppJs"
            "style.css\;kStyleCss")
set(_out "// Generated from coordinator/web by embed.cmake; do not edit.\n")
string(APPEND _out "#include \"coordinator/web/assets.h\"\n\nnamespace muster::web {\n\n")
foreach(_a IN LISTS _assets)
  list(GET _a 0 _file)
  list(GET _a 1 _name)
  file(READ "${SRC}/${_file}" _text)
  string(FIND "${_text}" ")muster_asset\"" _clash)
  if(NOT _clash EQUAL -1)
    message(FATAL_ERROR "${_file} contains the raw string's delimiter")
  endif()
  string(APPEND _out "extern const char ${_name}[] = R\"muster_asset(${_text})muster_asset\";\n\n")
endforeach()
string(APPEND _out "}  // namespace muster::web\n")
file(WRITE "${OUT}.tmp" "${_out}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
