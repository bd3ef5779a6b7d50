/* input.h: the fuzz input as a stream of bytes, shared by the harnesses.
 * Past its end every byte reads as 0, so any input is a whole program. */
#ifndef KP_FUZZ_INPUT_H
#define KP_FUZZ_INPUT_H

#include <stddef.h>

static const unsigned char *in;
static size_t in_left;

static unsigned next_byte(void) {
    if (!in_left) return 0;
    in_left--;
    return *in++;
}

#endif
