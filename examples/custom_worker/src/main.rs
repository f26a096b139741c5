//! A user's worker binary: `worker`, `enqueue`, `status`, `dead` over their own jobs.

// Optional, the binary's choice: Palisade allocates per job, and mimalloc runs the embedded
// path ~25 % faster than glibc malloc (README, Performance).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    palisade::cli::App::new(custom_worker::registry())
        .sink(custom_worker::INVENTORY)
        .run()
}
