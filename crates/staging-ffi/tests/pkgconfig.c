/* The smallest C program against an installed staging_ffi, built by CI's `cpp` stage with
 * `pkg-config --cflags --libs --static staging_ffi` (a prefix holding only the static library):
 * prints the version and the bits of a BF16 element, and makes and frees a configuration. */
#include <stdio.h>

#include "staging_ffi.h"

int main(void) {
  stg_config *config = NULL;
  if (stg_config_new(&config) != STG_OK) return 1;
  stg_config_free(config);
  printf("staging_ffi %s bf16=%u\n", stg_version(), stg_dtype_bits(STG_DTYPE_BF16));
  return 0;
}
