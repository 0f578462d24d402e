//! Where the provider's own threads run.

/// Moves the calling thread (`who`: one of the provider's own, the progress
/// agent or the DMA engine's mover) off the application's CPUs. A thread
/// inherits the affinity of the thread that started it, and MPI launchers
/// pin each rank to one core: there it could only run by taking the rank's
/// own time. A NIC's engine is not on the application's core either; on
/// another, it takes time from a rank that waits (polls) rather than from
/// one that computes. Every CPU if the application's are all there are.
pub fn float_off_the_application(who: &str) {
    // SAFETY: zeroed cpu_set_t are valid empty sets; CPU_SET and
    // CPU_ISSET stay within them; sched_getaffinity fills the calling
    // thread's (inherited from the application's thread that started it);
    // sched_setaffinity reads the new one.
    unsafe {
        let mut inherited: libc::cpu_set_t = std::mem::zeroed();
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let known = libc::sched_getaffinity(0, size, &mut inherited) == 0;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let cpus = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1) as usize;
        let cpus = cpus.min(libc::CPU_SETSIZE as usize);
        for cpu in 0..cpus {
            if !(known && libc::CPU_ISSET(cpu, &inherited)) {
                libc::CPU_SET(cpu, &mut set);
            }
        }
        if libc::CPU_COUNT(&set) == 0 {
            for cpu in 0..cpus {
                libc::CPU_SET(cpu, &mut set);
            }
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::info!(
                "{who} keeps its inherited CPU affinity: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}
