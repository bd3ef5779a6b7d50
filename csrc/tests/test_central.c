/* test_central.c: batch moves between thread caches and the central lists,
 * and spans going back to the page heap when all their objects are free. */
#include "check.h"
#include "kp_internal.h"

static unsigned chain_length(void *head) {
    unsigned n = 0;
    for (; head; head = _kp_next(head)) n++;
    return n;
}

static void test_fetch_and_return_batches(void) {
    unsigned cls = _kp_size_class(64);
    void *head;
    unsigned got = _kp_central_fetch(cls, 32, 32, &head);
    CHECK_EQ(got, 32);
    CHECK_EQ(chain_length(head), 32);
    CHECK(_kp_central_is_valid(cls));
    for (void *p = head; p; p = _kp_next(p)) CHECK(_kp_pagemap_class(p) == cls);
    size_t free_before = KP_LOAD(_kp_central(cls)->free_objects);
    _kp_central_return(cls, head, got);     /* a whole batch: kept in a transfer slot */
    CHECK(_kp_central(cls)->used >= 1);
    CHECK_EQ(KP_LOAD(_kp_central(cls)->free_objects), free_before + 32);
    CHECK(_kp_central_is_valid(cls));
    void *again;
    CHECK_EQ(_kp_central_fetch(cls, 32, 32, &again), 32);
    CHECK(again == head);                   /* handed on whole, in O(1) */
    _kp_central_return(cls, again, 32);
    _kp_central_drain(cls);
    CHECK_EQ(_kp_central(cls)->used, 0);
    CHECK(_kp_central_is_valid(cls));
}

static void test_empty_spans_go_back(void) {
    unsigned cls = _kp_size_class(4096);
    const kp_class_info *ci = &_kp_classes[cls];
    size_t spans_before = KP_LOAD(_kp_central(cls)->spans);
    void *head;
    unsigned want = ci->objects * 3;   /* three spans' worth */
    void *all = NULL;
    unsigned total = 0;
    while (total < want) {
        unsigned n = want - total > 32 ? 32 : want - total;
        unsigned got = _kp_central_fetch(cls, n, n, &head);
        CHECK(got > 0);
        if (!got) break;
        void *tail = head;
        while (_kp_next(tail)) tail = _kp_next(tail);
        _kp_set_next(tail, all);
        all = head;
        total += got;
    }
    CHECK(KP_LOAD(_kp_central(cls)->spans) >= spans_before + 2);
    CHECK(_kp_central_is_valid(cls));
    _kp_central_return(cls, all, total);
    CHECK(_kp_central_is_valid(cls));
    CHECK(KP_LOAD(_kp_central(cls)->spans) <= spans_before + 1);
    CHECK(_kp_pageheap_is_valid());
}

/* A span's free list longer than n but within room comes whole (its links
 * are not read); with room == n only n come. */
static void test_a_span_list_that_fits_the_room_comes_whole(void) {
    unsigned cls = _kp_size_class(240);
    const unsigned cap = _kp_classes[cls].objects;
    CHECK(cap > 20 && cap != _kp_classes[cls].batch);
    void *head;
    CHECK_EQ(_kp_central_fetch(cls, cap, cap, &head), cap);   /* one fresh span, every slot */
    void *rest = head;                                         /* give the first 20 back */
    for (unsigned i = 1; i < 20; i++) rest = _kp_next(rest);
    void *kept = _kp_next(rest);
    _kp_set_next(rest, NULL);
    _kp_central_return(cls, head, 20);
    CHECK(_kp_central_is_valid(cls));
    void *got_head;
    unsigned got = _kp_central_fetch(cls, 8, 32, &got_head);
    CHECK_EQ(got, 20);
    CHECK_EQ(chain_length(got_head), 20);
    CHECK(_kp_central_is_valid(cls));
    _kp_central_return(cls, got_head, got);
    got = _kp_central_fetch(cls, 8, 8, &got_head);
    CHECK_EQ(got, 8);
    CHECK_EQ(chain_length(got_head), 8);
    CHECK(_kp_central_is_valid(cls));
    _kp_central_return(cls, got_head, got);
    _kp_central_return(cls, kept, cap - 20);
    CHECK(_kp_central_is_valid(cls));
    CHECK(_kp_pageheap_is_valid());
}

static void test_objects_are_distinct_and_in_bounds(void) {
    unsigned cls = _kp_size_class(48);
    void *head;
    unsigned got = _kp_central_fetch(cls, 32, 32, &head);
    void *seen[32];
    unsigned n = 0;
    for (void *p = head; p; p = _kp_next(p)) seen[n++] = p;
    CHECK_EQ(n, got);
    for (unsigned i = 0; i < n; i++)
        for (unsigned j = i + 1; j < n; j++) {
            size_t d = seen[i] > seen[j] ? (size_t)((char *)seen[i] - (char *)seen[j]) : (size_t)((char *)seen[j] - (char *)seen[i]);
            CHECK(d >= 48);
        }
    _kp_central_return(cls, head, got);
}

/* return_to_spans moves runs of one span's objects whole: a chain that
 * switches span every few objects, cut off by n in the middle of a run,
 * returns exactly n objects, each to its own span, and leaves the rest. */
static void test_runs_of_two_spans_return_to_their_spans(void) {
    unsigned cls = _kp_size_class(1536);
    const unsigned cap = _kp_classes[cls].objects;
    kp_central *c = _kp_central(cls);
    size_t spans_before = KP_LOAD(c->spans);
    void *a, *b;
    CHECK_EQ(_kp_central_fetch(cls, cap, cap, &a), cap);   /* two spans, every slot */
    CHECK_EQ(_kp_central_fetch(cls, cap, cap, &b), cap);
    CHECK(_kp_pagemap_get((uintptr_t)a >> KP_PAGE_SHIFT) != _kp_pagemap_get((uintptr_t)b >> KP_PAGE_SHIFT));
    enum { MAXOBJ = 512 };
    void *objs[2 * MAXOBJ];
    unsigned n = 0;
    CHECK(cap <= MAXOBJ);
    while (a || b) {   /* interleave: 3 of a, 2 of b, ... */
        for (int k = 0; k < 3 && a; k++, a = _kp_next(a)) objs[n++] = a;
        for (int k = 0; k < 2 && b; k++, b = _kp_next(b)) objs[n++] = b;
    }
    CHECK_EQ(n, 2 * cap);
    for (unsigned i = 0; i + 1 < n; i++) _kp_set_next(objs[i], objs[i + 1]);
    _kp_set_next(objs[n - 1], NULL);
    size_t free_before = KP_LOAD(c->free_objects);
    unsigned first = 7;                        /* ends inside a run of span a */
    _kp_central_return(cls, objs[0], first);
    CHECK_EQ(KP_LOAD(c->free_objects), free_before + first);
    CHECK(_kp_central_is_valid(cls));
    CHECK_EQ(chain_length(objs[first]), n - first);   /* the rest is untouched */
    _kp_central_return(cls, objs[first], n - first);
    CHECK(_kp_central_is_valid(cls));
    CHECK_EQ(KP_LOAD(c->spans), spans_before);        /* both spans all free: gone */
    CHECK(_kp_pageheap_is_valid());
}

/* The checker itself: a slot of another span spliced into a span's list
 * (counts and tails all still right) makes _kp_central_is_valid fail. */
static void test_the_checker_finds_a_foreign_slot(void) {
    unsigned cls = _kp_size_class(3000);
    const unsigned cap = _kp_classes[cls].objects;
    CHECK(cap > 3 && _kp_classes[cls].batch > 3);
    void *chain[2];
    kp_span *span[2];
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(_kp_central_fetch(cls, cap, cap, &chain[k]), cap);   /* a whole span */
        span[k] = _kp_pagemap_get((uintptr_t)chain[k] >> KP_PAGE_SHIFT);
    }
    CHECK(span[0] != span[1]);
    void *rest[2];
    for (int k = 0; k < 2; k++) {                /* 3 slots back to each span's list */
        void *third = _kp_next(_kp_next(chain[k]));
        rest[k] = _kp_next(third);
        _kp_set_next(third, NULL);
        _kp_central_return(cls, chain[k], 3);
    }
    CHECK(_kp_central_is_valid(cls));
    void *a = span[0]->freelist, *b = span[1]->freelist;    /* swap the two heads */
    void *a_next = _kp_next(a), *b_next = _kp_next(b);
    span[0]->freelist = b, _kp_set_next(b, a_next);
    span[1]->freelist = a, _kp_set_next(a, b_next);
    CHECK(!_kp_central_is_valid(cls));
    span[0]->freelist = a, _kp_set_next(a, a_next);
    span[1]->freelist = b, _kp_set_next(b, b_next);
    CHECK(_kp_central_is_valid(cls));
    for (int k = 0; k < 2; k++) _kp_central_return(cls, rest[k], cap - 3);
    CHECK(_kp_central_is_valid(cls));
    CHECK(_kp_pageheap_is_valid());
}

int main(void) {
    _kp_init();
    RUN(test_fetch_and_return_batches);
    RUN(test_empty_spans_go_back);
    RUN(test_objects_are_distinct_and_in_bounds);
    RUN(test_a_span_list_that_fits_the_room_comes_whole);
    RUN(test_runs_of_two_spans_return_to_their_spans);
    RUN(test_the_checker_finds_a_foreign_slot);
    return DONE();
}
