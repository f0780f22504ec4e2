// DMA_EXPORT: what the shared libraries export. The project compiles with hidden visibility
// (-fvisibility=hidden, -fvisibility-inlines-hidden), so libdma.so and libdma_client.so export
// exactly the classes and functions of include/dma/ marked with it, and nothing of libfabric,
// toml++, isa-l or the private src/ parts, which stay free to change without breaking a program
// linked against the library. The same objects go into the static libraries, where the mark
// changes nothing; the Redis module links them statically and hides them again
// (-Wl,--exclude-libs,ALL and module/exports.map), so it still exports only its entry points.
//
// libdma.so's version script (cmake/libdma.map) additionally keeps the standard library's
// template instantiations, which have default visibility in libstdc++, out of its dynamic symbol
// table. tests/install/test_install.sh checks the result with nm -D --defined-only.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define DMA_EXPORT __attribute__((visibility("default")))
#else
#define DMA_EXPORT
#endif
