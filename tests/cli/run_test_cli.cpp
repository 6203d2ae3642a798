// Runs the end-to-end tests of the `loadstar` tool, tests/cli/test_cli.py, with /usr/bin/python3
// (the Python that has NumPy and h5py). A compiled launcher rather than a test of python3 itself,
// so that building this target builds the tool it tests.
//
// Usage: test_cli PATH/TO/test_cli.py PATH/TO/loadstar
#include <unistd.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TEST_SCRIPT LOADSTAR\n", argv[0]);
    return 2;
  }
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0) {
    std::printf("skipped: %s is missing\n", python);
    return 77;  // Meson's exit status for a skipped test
  }
  char* args[] = {const_cast<char*>(python), const_cast<char*>("-u"), argv[1], argv[2], nullptr};
  ::execv(python, args);
  std::perror("test_cli: cannot run /usr/bin/python3");
  return 1;
}
