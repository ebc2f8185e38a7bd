//! The deployable zip, as Lambda takes it: its layout, and its release
//! `bootstrap` under AWS's runtime emulator. `make test` builds the zip
//! last of the builds beside the integration tests; this module's name
//! sorts last, so that the test waiting for it holds a test thread only
//! once the others have started.

use node_fencer_tests::cluster::cluster_stack;
use node_fencer_tests::package::{built_zip, check_zip, extract_bootstrap};

/// The seed fenced in one invocation under the module's default timeout,
/// as `aws_runtime` fences it with the debug build, by the release
/// `bootstrap` Lambda runs (`panic = "abort"`, full LTO, stripped), out of
/// a zip laid out as `provided.al2023` takes it.
#[tokio::test]
async fn the_release_bootstrap_fences_the_seed_under_aws_runtime() -> anyhow::Result<()> {
    // Waited for before the cluster is taken: the zip may still be building.
    let zip = built_zip()?;
    let s = cluster_stack();
    let dir = s
        .dir
        .join(format!("release-bootstrap-{}", std::process::id()));
    let bootstrap = extract_bootstrap(&zip, &dir)?;
    for fact in check_zip(&zip, &bootstrap)? {
        eprintln!("the zip: {fact}");
    }
    crate::aws_runtime::fenced_in_one_invocation(&bootstrap).await
}
