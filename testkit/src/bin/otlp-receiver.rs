//! An OTLP/HTTP receiver on a free port for the throughput harness's `--otlp` runs: prints its
//! endpoint, then how many spans arrived, every 5 s, until killed.

fn main() {
    let receiver = palisade_testkit::OtlpReceiver::start();
    println!("{}", receiver.endpoint());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(5));
        eprintln!("spans received: {}", receiver.span_count());
    }
}
