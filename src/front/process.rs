//! The process's life under the shim: its one allocator, made at the first
//! hooked call (the configuration, the log); the exit and fork handlers,
//! armed once CUDA works, when the process also joins its neighbours; and
//! the process that loaded the shim, which tells a child forked before its
//! first call.

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Once, OnceLock};

use crate::core::allocator::state::Allocator;
use crate::core::config::settings::Config;
use crate::core::reclaimer::ForkPause;
use crate::cuda::driver;
use crate::peers::{fork, server};

static ALLOCATOR: OnceLock<Allocator> = OnceLock::new();

/// The allocator if a call has made it already.
pub fn allocator_if_made() -> Option<&'static Allocator> {
    ALLOCATOR.get()
}

/// The process's allocator. The first call reads the configuration; a bad
/// value ends the process with status 2 before anything is allocated.
pub fn allocator() -> &'static Allocator {
    ALLOCATOR.get_or_init(|| {
        let mut config = match Config::from_environment(std::env::vars_os()) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("{error}");
                std::process::exit(2);
            }
        };
        init_logging(&config);
        for (name, value) in &config.effective {
            log::debug!("{name}={value}");
        }
        let pid = std::process::id();
        let loaded_in = LOADED_IN_PID.load(Relaxed);
        if loaded_in != 0 && loaded_in != pid {
            // Forked before its first CUDA call: the parent's files are not its own.
            config.for_forked_child(pid);
        }
        Allocator::new(config, super::caller::object_of)
    })
}

/// `SOMA_DISABLE=1`: every call goes to the real one untouched, and the
/// driver's entry points are handed out as the driver gives them. Asked by
/// symbol lookups too, which must not make the allocator (a process may look
/// symbols up and never call CUDA, or fork first).
pub fn disabled() -> bool {
    static READ: OnceLock<bool> = OnceLock::new();
    match allocator_if_made() {
        Some(allocator) => allocator.config.disable,
        None => *READ.get_or_init(|| Config::disables(std::env::var_os("SOMA_DISABLE").as_deref())),
    }
}

/// The process that loaded the shim (`LD_PRELOAD` loads it before `main`).
static LOADED_IN_PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn record_loading_process() {
    LOADED_IN_PID.store(std::process::id(), Relaxed);
}

#[used]
#[link_section = ".init_array"]
static RECORD_LOADING_PROCESS: extern "C" fn() = record_loading_process;

fn init_logging(config: &Config) {
    let _ = env_logger::Builder::new()
        .parse_filters(&config.log)
        .format_target(false)
        .format_timestamp(None)
        .format_module_path(false)
        .try_init();
}

/// Arms the process's exit and fork handlers, once. Called after a CUDA
/// call has initialised the runtime, so that the exit handler runs before
/// the runtime's own (they run in reverse order): the reclaimer thread stops
/// while the driver still works, then the `SOMA_STATS` table is written.
pub fn arm_process_handlers() {
    static ARMED: Once = Once::new();
    // SAFETY: the handlers are plain extern "C" fns with no arguments.
    ARMED.call_once(|| unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child));
    });
    if !JOINED.load(Relaxed) && !JOINED.swap(true, Relaxed) {
        join_neighbours();
    }
}

/// This process has joined its neighbours (a forked child joins anew).
static JOINED: AtomicBool = AtomicBool::new(false);

/// Once CUDA works in this process: its server listens, so that the other
/// shim processes of the user find it and may ask it for memory
/// (`SOMA_NEIGHBOURS`), and its reclaimer thread starts at the next free,
/// for the decay (`SOMA_DECAY_MS`).
fn join_neighbours() {
    let allocator = allocator();
    if allocator.config.disable {
        return;
    }
    if allocator.config.decay.is_some() {
        allocator.reclaimer.wake();
    }
    if allocator.config.neighbours {
        server::server_endpoint(allocator);
    }
}

extern "C" fn at_exit() {
    // A panic here must not unwind into libc's exit.
    let _ = std::panic::catch_unwind(|| {
        let allocator = allocator();
        allocator.reclaimer.stop();
        server::stop_server();
        if allocator.reporting() {
            allocator.report(driver::loaded());
        }
    });
}

thread_local! {
    /// The reclaimer's and the IPC server's locks, held by the forking thread across `fork`.
    static FORK_PAUSE: std::cell::RefCell<Option<(ForkPause<'static>, fork::ForkPause)>> = const { std::cell::RefCell::new(None) };
}

/// Before `fork`: no step of the shim's thread under way, and none of its
/// locks held, so that the child inherits no lock held by a thread it will
/// not have.
extern "C" fn before_fork() {
    // The importer's lock first (see `fork::before_fork`).
    let imports = fork::before_fork();
    let pause = (allocator().reclaimer.before_fork(), imports.and_server());
    let _ = FORK_PAUSE.try_with(|slot| *slot.borrow_mut() = Some(pause));
}

extern "C" fn after_fork_in_parent() {
    let _ = FORK_PAUSE.try_with(|slot| slot.borrow_mut().take());
}

/// In the child: the reclaimer thread did not come along, and the reports
/// go to files of the child's own.
extern "C" fn after_fork_in_child() {
    // A panic here must not unwind into libc's fork.
    let _ = std::panic::catch_unwind(|| {
        let allocator = allocator();
        JOINED.store(false, Relaxed);
        if let Ok(Some((pause, ipc_pause))) = FORK_PAUSE.try_with(|slot| slot.borrow_mut().take()) {
            pause.in_child(&allocator.reclaimer);
            ipc_pause.in_child();
        }
        allocator.after_fork();
    });
}
