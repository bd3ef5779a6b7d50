/* test_sizeclass.c: the class table on its own: rounding of every size from
 * 0 to the small limit, step bounds, span waste, natural alignment. */
#include "check.h"
#include "kp_internal.h"

static void test_table_is_valid(void) { CHECK(_kp_sizeclass_is_valid()); }

static void test_every_size_rounds_to_the_smallest_class(void) {
    for (size_t s = 0; s <= KP_SMALL_MAX; s++) {
        unsigned c = _kp_size_class(s);
        if (c < 1 || c >= KP_NUM_CLASSES || _kp_classes[c].size < s || (c > 1 && _kp_classes[c - 1].size >= s && s)) {
            CHECK(!"size rounds to the wrong class");
            fprintf(stderr, "  size %zu -> class %u (%u)\n", s, c, _kp_classes[c].size);
            return;
        }
    }
    CHECK(1);
}

static void test_fine_and_coarse_steps(void) {
    CHECK_EQ(_kp_classes[_kp_size_class(0)].size, 16);
    CHECK_EQ(_kp_classes[_kp_size_class(1)].size, 16);
    CHECK_EQ(_kp_classes[_kp_size_class(17)].size, 32);
    CHECK_EQ(_kp_classes[_kp_size_class(1000)].size, 1008);
    CHECK_EQ(_kp_classes[_kp_size_class(1025)].size, 1056);
    CHECK_EQ(_kp_classes[_kp_size_class(1057)].size, 1152);
    /* a power of two plus a header: 1/32 above it, not the next 1/8 step */
    for (size_t p = 1024; p < KP_SMALL_MAX; p *= 2) {
        CHECK_EQ(_kp_classes[_kp_size_class(p + 8)].size, p + p / 32);
        CHECK_EQ(_kp_classes[_kp_size_class(p + p / 32 + 1)].size, p + p / 8);
    }
    CHECK_EQ(_kp_classes[_kp_size_class(KP_SMALL_MAX)].size, KP_SMALL_MAX);
    for (unsigned c = 2; c < KP_NUM_CLASSES; c++) {
        uint32_t prev = _kp_classes[c - 1].size, cur = _kp_classes[c].size;
        if (prev < KP_FINE_MAX) CHECK_EQ(cur - prev, 16);
        else CHECK((cur - prev) * 8 <= prev);
    }
}

static void test_spans_waste_at_most_a_32nd(void) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        const kp_class_info *ci = &_kp_classes[c];
        size_t bytes = (size_t)ci->npages * KP_PAGE_SIZE;
        CHECK((bytes - (size_t)ci->objects * ci->size) * 32 <= bytes);
        CHECK(ci->batch >= 2 && ci->batch <= KP_BATCH_MAX);
        CHECK(ci->tcache_max >= ci->batch);
    }
}

static void test_powers_of_two_are_classes(void) {
    for (size_t p = 16; p <= KP_PAGE_SIZE; p *= 2) CHECK_EQ(_kp_classes[_kp_size_class(p)].size, p);
}

int main(void) {
    _kp_init();
    RUN(test_table_is_valid);
    RUN(test_every_size_rounds_to_the_smallest_class);
    RUN(test_fine_and_coarse_steps);
    RUN(test_spans_waste_at_most_a_32nd);
    RUN(test_powers_of_two_are_classes);
    return DONE();
}
