//! A user's worker binary: `worker`, `enqueue`, `status`, `dead` over their own jobs.

fn main() -> std::process::ExitCode {
    palisade::cli::App::new(custom_worker::registry())
        .sink(custom_worker::INVENTORY)
        .run()
}
