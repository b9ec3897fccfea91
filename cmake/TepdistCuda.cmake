# CUDA detection. For now it only reports what it finds, so a GPU backend (compute/cuda) can slot in
# later behind TEPDIST_HAVE_CUDA; a machine without the toolkit builds and tests everything else.
set(TEPDIST_HAVE_CUDA OFF)
if(TEPDIST_CUDA)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_library(TEPDIST_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_library(TEPDIST_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    set(TEPDIST_HAVE_CUDA ON)
    message(STATUS "tepdist: CUDA ${CUDAToolkit_VERSION} (nvcc in ${CUDAToolkit_BIN_DIR}); "
                   "cuDNN: ${TEPDIST_CUDNN_LIBRARY}; NCCL: ${TEPDIST_NCCL_LIBRARY} "
                   "(detected only: the GPU backend is not built yet)")
  else()
    message(STATUS "tepdist: CUDA toolkit not found; the GPU backend is off")
  endif()
else()
  message(STATUS "tepdist: CUDA detection disabled (TEPDIST_CUDA=OFF)")
endif()
