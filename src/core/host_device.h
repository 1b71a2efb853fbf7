// DS_HOST_DEVICE: a function that host and CUDA device code share (plain inline for the host
// compiler).
#pragma once

#if defined(__CUDACC__)
#define DS_HOST_DEVICE __host__ __device__
#else
#define DS_HOST_DEVICE
#endif
