# Chooses the NCCL that muster compiles and links against. One process can
# hold one libnccl.so.2: when LibTorch loads an NCCL of its own, muster must
# link that very library, or the linker resolves LibTorch's NCCL symbols
# against another version and fails ("undefined reference to ncclCommGrow"),
# or the loader picks one of the two at run time.
#
# In order:
#   1. MUSTER_NCCL_ROOT, when set: <root>/include/nccl.h and
#      <root>/lib/libnccl.so[.2] (a user's own NCCL);
#   2. the NCCL that LibTorch loads, when libtorch_cuda.so needs libnccl.so.2:
#      the one in LibTorch's RPATH/RUNPATH directories or beside it (PyPI's
#      wheel keeps it in nvidia/nccl, next to its nccl.h);
#   3. the CUDA toolkit's.
# A choice whose version differs from the NCCL that LibTorch loads, or whose
# header differs from its library, stops the configure step with both
# versions named.
#
# Reads: TORCH_INSTALL_PREFIX (after find_package(Torch)), CUDAToolkit_*.
# Sets: NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION (e.g. 2.30.7), and
# MUSTER_NCCL_SOURCE (a few words on where it came from).

set(MUSTER_NCCL_ROOT "" CACHE PATH
    "An NCCL to build against (include/nccl.h, lib/libnccl.so); default: LibTorch's, else the CUDA toolkit's")

# muster_nccl_header_version(<dir> <out>): NCCL_MAJOR.MINOR.PATCH of <dir>/nccl.h.
function(muster_nccl_header_version dir out)
  set(v "")
  if(EXISTS "${dir}/nccl.h")
    file(STRINGS "${dir}/nccl.h" lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
    foreach(part MAJOR MINOR PATCH)
      string(REGEX MATCH "NCCL_${part} +([0-9]+)" _ "${lines}")
      list(APPEND v "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN v "." v)
  endif()
  set(${out} "${v}" PARENT_SCOPE)
endfunction()

# muster_nccl_library_version(<file> <out>): the version a libnccl reports in
# its banner ("NCCL version 2.30.7+cuda13.3"), or empty.
function(muster_nccl_library_version file out)
  set(v "")
  if(EXISTS "${file}")
    file(STRINGS "${file}" banner REGEX "^NCCL version [0-9]+\\.[0-9]+\\.[0-9]+" LIMIT_COUNT 1)
    string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" v "${banner}")
  endif()
  set(${out} "${v}" PARENT_SCOPE)
endfunction()

# LibTorch's own NCCL: the libnccl.so.2 that libtorch_cuda.so loads, if it
# loads one (a LibTorch that links NCCL statically, or a CPU one, has none).
set(_torch_nccl "")
set(_torch_cuda "${TORCH_INSTALL_PREFIX}/lib/libtorch_cuda.so")
if(TORCH_INSTALL_PREFIX AND EXISTS "${_torch_cuda}" AND CMAKE_OBJDUMP)
  execute_process(COMMAND "${CMAKE_OBJDUMP}" -p "${_torch_cuda}"
                  OUTPUT_VARIABLE _dynamic ERROR_QUIET)
  if(_dynamic MATCHES "NEEDED +libnccl\\.so\\.2")
    file(READ_ELF "${_torch_cuda}" RPATH _rpath RUNPATH _runpath CAPTURE_ERROR _elf_error)
    get_filename_component(_origin "${_torch_cuda}" DIRECTORY)
    string(REPLACE ":" ";" _dirs "${_rpath}:${_runpath}")
    list(APPEND _dirs "${_origin}")
    foreach(_dir IN LISTS _dirs)
      string(REPLACE "$ORIGIN" "${_origin}" _dir "${_dir}")
      if(_dir AND EXISTS "${_dir}/libnccl.so.2")
        get_filename_component(_torch_nccl "${_dir}/libnccl.so.2" REALPATH)
        break()
      endif()
    endforeach()
    if(NOT _torch_nccl)
      message(WARNING "muster: ${_torch_cuda} loads libnccl.so.2, but none lies in its "
              "RPATH/RUNPATH (${_rpath}${_runpath}); muster cannot check that it links the same NCCL")
    endif()
  endif()
endif()

if(MUSTER_NCCL_ROOT)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${MUSTER_NCCL_ROOT}/include" NO_DEFAULT_PATH)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 PATHS "${MUSTER_NCCL_ROOT}/lib"
               "${MUSTER_NCCL_ROOT}/lib64" NO_DEFAULT_PATH)
  set(MUSTER_NCCL_SOURCE "MUSTER_NCCL_ROOT")
elseif(_torch_nccl)
  get_filename_component(_nccl_lib_dir "${_torch_nccl}" DIRECTORY)
  find_path(NCCL_INCLUDE_DIR nccl.h PATHS "${_nccl_lib_dir}/../include" NO_DEFAULT_PATH)
  if(NOT NCCL_INCLUDE_DIR)
    # A LibTorch that brings libnccl.so.2 without its header: any nccl.h of
    # the same version will do (checked below).
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  endif()
  set(NCCL_LIBRARY "${_torch_nccl}" CACHE FILEPATH "The NCCL library muster links" FORCE)
  set(MUSTER_NCCL_SOURCE "LibTorch's")
else()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  set(MUSTER_NCCL_SOURCE "the CUDA toolkit's")
endif()

set(NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  muster_nccl_header_version("${NCCL_INCLUDE_DIR}" NCCL_VERSION)
  muster_nccl_library_version("${NCCL_LIBRARY}" _lib_version)
  if(_lib_version AND NOT _lib_version VERSION_EQUAL NCCL_VERSION)
    message(FATAL_ERROR
      "muster: NCCL header and library differ: ${NCCL_INCLUDE_DIR}/nccl.h is ${NCCL_VERSION}, "
      "${NCCL_LIBRARY} is ${_lib_version}. Point MUSTER_NCCL_ROOT at one NCCL holding both.")
  endif()
  if(_torch_nccl)
    muster_nccl_library_version("${_torch_nccl}" _torch_version)
    if(NOT _torch_version VERSION_EQUAL NCCL_VERSION)
      message(FATAL_ERROR
        "muster: LibTorch (${TORCH_INSTALL_PREFIX}) loads NCCL ${_torch_version} from ${_torch_nccl}, "
        "but muster would build against NCCL ${NCCL_VERSION} (${MUSTER_NCCL_SOURCE}: "
        "${NCCL_INCLUDE_DIR}, ${NCCL_LIBRARY}). One process holds one NCCL: unset MUSTER_NCCL_ROOT "
        "or point it at NCCL ${_torch_version}.")
    endif()
  endif()
endif()
