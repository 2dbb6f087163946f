/* error.c — the per-thread context string behind qual_last_error(). */
#include <stdio.h>

#include "engine.h"

static __thread char last_error[512];

const char *qual_last_error(void)
{
    return last_error;
}

int qual_set_error(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return err;
}
