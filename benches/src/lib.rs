//! Benches live in `benches/`; the harnesses' shared pieces live here.

/// A Redis server's CPU seconds (user + sys) and commands processed so far, from one `INFO`:
/// the harnesses report per-job deltas of both.
pub async fn redis_counters(url: &str) -> (f64, u64) {
    let pool = palisade::store::redis::pool(url).expect("redis url");
    let mut conn = pool.get().await.expect("redis reachable");
    let info: String = deadpool_redis::redis::cmd("INFO")
        .arg("all")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let cpu = info
        .lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .map(|v| v.trim().parse::<f64>().unwrap_or(0.0))
        .sum();
    let commands = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (cpu, commands)
}
