//! Process exit: an application that exits without closing its endpoints
//! (MPI_Finalize does not always close them) must not leave our shared
//! objects in /dev/shm. A destructor of the library removes what this
//! process still owns, at exit or when libfabric unloads the provider, and
//! what processes of this user that were killed have left.

use unimem_mailbox::shm::{reclaim_dead_objects, remove_own_objects};

extern "C" fn remove_objects_at_exit() {
    // Nothing may unwind out of a destructor; a failure only leaves objects
    // for the next process of this user to reclaim.
    let _ = std::panic::catch_unwind(|| {
        remove_own_objects();
        reclaim_dead_objects();
    });
}

// The dynamic loader calls every entry of
// .fini_array when the library is unloaded or the process exits.
#[used]
#[link_section = ".fini_array"]
static REMOVE_OBJECTS_AT_EXIT: extern "C" fn() = remove_objects_at_exit;
