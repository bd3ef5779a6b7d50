// test_cxx_plugin.cc: C++ that test_preload.c loads with RTLD_LOCAL, as
// Python loads an extension module: its libstdc++ is then outside the
// global scope, and libkpool-malloc.so's operator new must still call the
// new_handler and throw std::bad_alloc, and its nothrow forms return
// nullptr when the handler throws.
#include <cstddef>
#include <cstdint>
#include <new>

static int handler_calls;
static void give_up() { handler_calls++; std::set_new_handler(nullptr); }
static void throw_from_handler() { handler_calls++; throw std::bad_alloc(); }
struct alignas(256) Wide { char bytes[300]; };

// 1 if a huge new called the handler once, then threw std::bad_alloc
extern "C" int plugin_huge_new_throws(void) {
    volatile std::size_t huge = SIZE_MAX / 4;
    handler_calls = 0;
    std::set_new_handler(give_up);
    try {
        char *p = new char[huge];
        delete[] p;
        return 0;
    } catch (const std::bad_alloc &) {
        return handler_calls == 1;
    }
}

// 1 if new(std::nothrow), plain and aligned, gave nullptr when the handler threw
extern "C" int plugin_nothrow_new_with_a_throwing_handler(void) {
    volatile std::size_t huge = SIZE_MAX / 4;
    handler_calls = 0;
    std::set_new_handler(throw_from_handler);
    char *p = new (std::nothrow) char[huge];
    Wide *w = new (std::nothrow) Wide[huge / 512];
    std::set_new_handler(nullptr);
    return p == nullptr && w == nullptr && handler_calls == 2;
}
