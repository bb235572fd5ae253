/* Exercises the NCCL C ABI the way an application does, without a GPU.
 *
 * usage: abi_smoke bound EXPECTED_VERSION_CODE
 *        abi_smoke unbound
 *
 * Prints one line per observation (compared across link modes by tests/c_abi.rs) and exits
 * non-zero on the first failed expectation. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>
#include <stragglar.h>

static int failures = 0;

#define EXPECT(cond, ...)                                    \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      failures++;                                            \
    }                                                        \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  int bound = strcmp(argv[1], "bound") == 0;
  int expected_version = argc > 2 ? atoi(argv[2]) : 0;

  /* Interception: our extension is reachable through the global scope. */
  typedef ncclResult_t (*get_version_fn)(int*);
  typedef ncclResult_t (*get_binding_fn)(stragglarNcclBinding_t*);
  get_version_fn our_version = (get_version_fn)dlsym(RTLD_DEFAULT, "stragglarGetVersion");
  get_binding_fn our_binding = (get_binding_fn)dlsym(RTLD_DEFAULT, "stragglarGetNcclBinding");
  EXPECT(our_version && our_binding, "stragglar is not in the process");
  if (our_version && our_binding) {
    int v = 0;
    EXPECT(our_version(&v) == ncclSuccess && v > 0, "stragglarGetVersion");
    EXPECT(our_version(NULL) == ncclInvalidArgument, "stragglarGetVersion(NULL)");
    stragglarNcclBinding_t b;
    EXPECT(our_binding(&b) == ncclSuccess, "stragglarGetNcclBinding");
    EXPECT(b.bound == bound, "bound=%d detail=%s", b.bound, b.detail);
    printf("interception: stragglar %d present, bound=%d\n", v, b.bound);
  }

  int version = -1;
  ncclResult_t rc = ncclGetVersion(&version);
  if (bound) {
    EXPECT(rc == ncclSuccess && version == expected_version, "ncclGetVersion rc=%d version=%d", rc, version);
    printf("version: %d\n", version);
  } else {
    EXPECT(rc == ncclSystemError && version == -1, "unbound ncclGetVersion rc=%d version=%d", rc, version);
  }

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  rc = ncclGetUniqueId(&id);
  EXPECT(rc == (bound ? ncclSuccess : ncclSystemError), "ncclGetUniqueId rc=%d", rc);

  ncclComm_t comm = NULL;
  rc = ncclCommInitRank(&comm, 2, id, 0);
  EXPECT(rc != ncclSuccess, "ncclCommInitRank cannot succeed without a GPU");
  printf("ncclCommInitRank: %d\n", rc);
  const char* last = ncclGetLastError(NULL);
  EXPECT(last != NULL, "ncclGetLastError");
  if (bound) {
    EXPECT(rc == ncclUnhandledCudaError, "no GPU: rc=%d", rc);
    printf("last error: %s\n", last ? last : "(null)");
  } else {
    EXPECT(rc == ncclSystemError, "unbound init rc=%d", rc);
    EXPECT(last && strstr(last, "STRAGGLAR_NCCL_LIB"), "unbound last error says what to set: %s", last);
  }

  for (int code = -1; code <= 10; code++) {
    const char* text = ncclGetErrorString((ncclResult_t)code);
    EXPECT(text != NULL && text[0] != '\0', "ncclGetErrorString(%d)", code);
    if (bound) printf("error string %d: %s\n", code, text);
  }

  /* NULL outputs and values outside every enum: an error code, never a crash. */
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL)");
  EXPECT(ncclGetUniqueId(NULL) == ncclInvalidArgument, "ncclGetUniqueId(NULL)");
  EXPECT(ncclCommInitRank(NULL, 2, id, 0) == ncclInvalidArgument, "ncclCommInitRank(NULL)");
  EXPECT(ncclCommCount(NULL, NULL) == ncclInvalidArgument, "ncclCommCount(NULL, NULL)");
  EXPECT(ncclCommGetAsyncError(NULL, NULL) == ncclInvalidArgument, "ncclCommGetAsyncError(NULL, NULL)");
  EXPECT(ncclRedOpCreatePreMulSum(NULL, NULL, ncclFloat, ncclScalarHostImmediate, NULL) == ncclInvalidArgument,
         "ncclRedOpCreatePreMulSum(NULL op)");
  EXPECT(pncclGetVersion(NULL) == ncclInvalidArgument, "pncclGetVersion(NULL)");

  float buf[4] = {0};
  ncclComm_t bogus = (ncclComm_t)(void*)buf; /* never dereferenced: the arguments are refused first */
  EXPECT(ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, bogus, NULL) == ncclInvalidArgument,
         "ncclAllReduce with an unknown datatype");
  EXPECT(ncclAllReduce(buf, buf, 4, ncclFloat, (ncclRedOp_t)-7, bogus, NULL) == ncclInvalidArgument,
         "ncclAllReduce with an invalid op");
  EXPECT(ncclAllReduce(buf, buf, 4, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument,
         "ncclAllReduce with a NULL communicator");

  /* Groups pass through (NCCL accepts an empty group). */
  rc = ncclGroupStart();
  EXPECT(rc == (bound ? ncclSuccess : ncclSystemError), "ncclGroupStart rc=%d", rc);
  rc = ncclGroupEnd();
  EXPECT(rc == (bound ? ncclSuccess : ncclSystemError), "ncclGroupEnd rc=%d", rc);

  printf("%s\n", failures ? "abi_smoke: FAILED" : "abi_smoke: ok");
  return failures ? 1 : 0;
}
