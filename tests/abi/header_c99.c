/* The public header on its own, as strict C99 (-std=c99 -pedantic-errors -Werror), and the loaded library's
 * version against the header's macros. */
#include "lbopt.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  char expected[32];
  const uint32_t v = lbopt_version();
  snprintf(expected, sizeof expected, "%d.%d.%d", LBOPT_VERSION_MAJOR, LBOPT_VERSION_MINOR, LBOPT_VERSION_PATCH);
  if (v != LBOPT_VERSION) {
    printf("lbopt_version() = 0x%x, header says 0x%x\n", (unsigned)v, (unsigned)LBOPT_VERSION);
    return 1;
  }
  if (v >> 16 != LBOPT_VERSION_MAJOR || ((v >> 8) & 0xff) != LBOPT_VERSION_MINOR || (v & 0xff) != LBOPT_VERSION_PATCH) {
    printf("LBOPT_VERSION does not encode its parts\n");
    return 1;
  }
  if (strcmp(lbopt_version_string(), expected) != 0) {
    printf("lbopt_version_string() = %s, expected %s\n", lbopt_version_string(), expected);
    return 1;
  }
  if (lbopt_build_info()[0] != '{' || strcmp(lbopt_status_string(LBOPT_OK), "") == 0) {
    printf("build info or status text malformed\n");
    return 1;
  }
  printf("lbopt %s: %s\n", lbopt_version_string(), lbopt_build_info());
  return 0;
}
