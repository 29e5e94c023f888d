/* What src/cabi/sys.rs is generated from (build.rs, with bindgen): the structures,
 * enums and constants of the system's rdma-core headers, so the C ABI lays out every
 * object exactly as the programs compiled against them expect. */
#include <infiniband/verbs.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/rdma_cma.h>
