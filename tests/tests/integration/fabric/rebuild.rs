//! A rebuild of the provider while the tests run does not reach their
//! children. Cargo deletes a library it rebuilds when the compile starts
//! and puts the new one in place when the link ends; the tests start such
//! builds themselves (`scripts/build`, from `heap::library` and
//! `scripts/mpirun-unimem` when nothing is staged yet), and so may the
//! developer. Children started meanwhile found no provider
//! (`fi_getinfo: -61`, two `fabric::atomic` tests once, under load); they
//! load the build the run started with (`unimem_tests::pinned`).

use std::path::PathBuf;

use unimem_tests::cluster::{built_library, provider_library, Msg, Order};

use super::cluster;

/// A library moved away, put back when dropped (on a panic too).
struct MovedAway {
    from: PathBuf,
    to: PathBuf,
}

impl Drop for MovedAway {
    fn drop(&mut self) {
        if let Err(e) = std::fs::rename(&self.to, &self.from) {
            eprintln!(
                "put {} back as {}: {e}",
                self.to.display(),
                self.from.display()
            );
        }
    }
}

#[test]
fn children_start_while_cargo_rebuilds_the_provider() {
    let pinned = provider_library();
    let built = built_library();
    assert_ne!(pinned, built, "the children load a pinned copy");
    assert_eq!(
        std::fs::read(&pinned).expect("read the pinned provider"),
        std::fs::read(&built).expect("read the built provider"),
    );
    if std::env::var_os("UNIMEM_FI_LIB").is_some() {
        eprintln!("$UNIMEM_FI_LIB is not cargo's to rebuild: left in place");
    }
    // What cargo does to it for as long as a rebuild's compile takes.
    let _back = std::env::var_os("UNIMEM_FI_LIB").is_none().then(|| {
        let away = built.with_extension("so.rebuilding");
        std::fs::rename(&built, &away).expect("move the built provider away");
        MovedAway {
            from: built.clone(),
            to: away,
        }
    });
    let mut c = cluster("rebuild");
    c.spawn(2).connect_all();
    c.transfer(0, 1, &[Msg::new(100, 1)], Order::Posted);
    c.finish();
}
