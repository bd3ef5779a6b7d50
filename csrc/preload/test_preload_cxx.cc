// test_preload_cxx.cc: C++'s operator new and delete under
// LD_PRELOAD=libkpool-malloc.so: every form reaches kpool, an impossible
// request throws std::bad_alloc (after the new_handler), nothrow forms
// return nullptr, aligned forms align. Exit status 0 only if all hold.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <malloc.h>
#include <new>
#include <string>
#include <vector>

static int failed;
#define CHECK(c) do { if (!(c)) { std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failed++; } } while (0)

struct alignas(256) Wide { char bytes[300]; };
static int handler_calls;
static void out_of_memory() { handler_calls++; std::set_new_handler(nullptr); }
static void throw_from_handler() { handler_calls++; throw std::bad_alloc(); }

int main() {
    void *(*volatile plain_new)(std::size_t) = static_cast<void *(*)(std::size_t)>(&::operator new);
    Dl_info info;
    CHECK(dladdr(reinterpret_cast<void *>(plain_new), &info) && std::strstr(info.dli_fname, "libkpool-malloc.so"));

    std::size_t before = mallinfo2().uordblks;
    int *one = new int(7);
    int *many = new int[1000];
    CHECK(mallinfo2().uordblks > before);
    delete one;                                   // sized delete (C++14)
    delete[] many;
    CHECK(mallinfo2().uordblks == before);

    Wide *w = new Wide;                           // aligned new (C++17)
    Wide *ws = new Wide[3];
    CHECK(reinterpret_cast<std::uintptr_t>(w) % 256 == 0 && reinterpret_cast<std::uintptr_t>(ws) % 256 == 0);
    delete w;
    delete[] ws;
    Wide *wn = new (std::nothrow) Wide;
    CHECK(wn && reinterpret_cast<std::uintptr_t>(wn) % 256 == 0);
    delete wn;

    std::vector<std::string> v;
    for (int i = 0; i < 20000; i++) v.push_back(std::string(static_cast<std::size_t>(i % 300), 'x'));
    v.clear();
    v.shrink_to_fit();

    volatile std::size_t huge = SIZE_MAX / 4;
    CHECK(new (std::nothrow) char[huge] == nullptr);
    bool threw = false;
    std::set_new_handler(out_of_memory);
    try {
        char *p = new char[huge];
        delete[] p;
    } catch (const std::bad_alloc &e) {
        threw = std::strcmp(e.what(), "std::bad_alloc") == 0;
    }
    CHECK(threw && handler_calls == 1);
    threw = false;
    try {
        Wide *p = new Wide[huge / 512];
        delete[] p;
    } catch (const std::bad_alloc &) {
        threw = true;
    }
    CHECK(threw);
    // nothrow new whose handler throws: nullptr (a nothrow new must not let
    // the handler's exception out; it used to terminate the program)
    handler_calls = 0;
    std::set_new_handler(throw_from_handler);
    CHECK(new (std::nothrow) char[huge] == nullptr);
    CHECK(new (std::nothrow) Wide[huge / 512] == nullptr);
    CHECK(handler_calls == 2);
    std::set_new_handler(nullptr);
    std::printf("%s test_preload_cxx\n", failed ? "FAIL" : "ok  ");
    return failed != 0;
}
