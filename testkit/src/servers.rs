//! Private `redis-server` processes for tests: each on a free loopback port, stopped by pid
//! when dropped. Tests never touch the shared Redis on 6379.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::tls::Certificates;

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
    /// CA file when the server speaks only TLS.
    tls_ca: Option<PathBuf>,
    /// The configuration file a sentinel starts from (and rewrites).
    conf: Option<PathBuf>,
    /// Environment of the process (a skewed clock's).
    env: Vec<(String, String)>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// A server that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A server with an append-only file fsynced on every write.
    pub fn start_with_aof() -> Self {
        Self::start_with(&[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_as(extra, None, Vec::new())
    }

    fn start_as(extra: &[&str], sentinel_conf: Option<&str>, env: Vec<(String, String)>) -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-redis-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = sentinel_conf.map(|text| {
            let path = dir.join("sentinel.conf");
            std::fs::write(&path, text).unwrap();
            path
        });
        let mut server = Self {
            port: free_port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            tls_ca: None,
            conf,
            env,
        };
        server.start_fresh();
        server
    }

    /// A server that keeps nothing on disk and reads its wall clock from `clock`: its `TIME`,
    /// so the coordinator's clock, and its key expiry move as the test sets it.
    pub fn start_with_clock(clock: &crate::clock::SkewedClock) -> Self {
        Self::start_as(&["--save", "", "--appendonly", "no"], None, clock.env())
    }

    /// A TLS-only server with a certificate for 127.0.0.1 / localhost signed by a CA made
    /// here ([`Certificates`]); the CA's PEM is at [`RedisServer::tls_ca`].
    pub fn start_tls() -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-certs-{}", uuid::Uuid::new_v4()));
        Self::start_tls_with(
            &["--save", "", "--appendonly", "no"],
            &Certificates::make(&dir),
        )
    }

    /// A TLS-only server with `extra` arguments and the certificates `certs` (several servers
    /// of one cluster share one CA).
    pub fn start_tls_with(extra: &[&str], certs: &Certificates) -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-redis-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |path: &std::path::Path| path.display().to_string();
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend([
            "--tls-cert-file".into(),
            file(&certs.cert),
            "--tls-key-file".into(),
            file(&certs.key),
            "--tls-ca-cert-file".into(),
            file(&certs.ca),
            "--tls-auth-clients".into(),
            "no".into(),
        ]);
        let mut server = Self {
            port: free_port(),
            extra: args,
            tls_ca: Some(certs.ca.clone()),
            dir,
            child: None,
            conf: None,
            env: Vec::new(),
        };
        server.start_fresh();
        server
    }

    pub fn tls_ca(&self) -> &std::path::Path {
        self.tls_ca.as_deref().expect("a TLS server")
    }

    /// The first start: on a port another process took between `free_port` and the bind
    /// (tests start clusters in parallel, each asking for a dozen ports), again on fresh ones —
    /// the port and a cluster bus port. Restarts keep their port ([`RedisServer::spawn`]).
    fn start_fresh(&mut self) {
        for _ in 0..4 {
            if self.try_spawn() {
                return;
            }
            self.stop();
            self.port = free_port();
            if let Some(i) = self.extra.iter().position(|a| a == "--cluster-port") {
                self.extra[i + 1] = free_port().to_string();
            }
        }
        self.spawn();
    }

    fn spawn(&mut self) {
        if !self.try_spawn() {
            panic!("private redis-server on port {} did not start", self.port);
        }
    }

    /// Starts the process; whether it answered PING within 10 s.
    fn try_spawn(&mut self) -> bool {
        let ports = match self.tls_ca {
            Some(_) => [
                "--port".to_string(),
                "0".into(),
                "--tls-port".into(),
                self.port.to_string(),
            ],
            None => [
                "--port".to_string(),
                self.port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
            ],
        };
        let mut command = Command::new("redis-server");
        if let Some(conf) = &self.conf {
            command.arg(conf).arg("--sentinel");
        }
        let child = command
            .args(ports)
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Ours answering, not another process that holds the port (then ours exits).
            let pid = self.child.as_ref().map(Child::id).unwrap_or_default();
            let ours = self.cli(&["INFO", "server"]).is_some_and(|info| {
                info.lines()
                    .any(|l| l.trim() == format!("process_id:{pid}"))
            });
            if ours {
                return true;
            }
            // A server that could not bind its port exits at once.
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        match self.tls_ca {
            Some(_) => format!("rediss://127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Runs one command through redis-cli; `None` if the server is not answering.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut cli = Command::new("redis-cli");
        cli.args(["-p", &self.port.to_string()]);
        if let Some(ca) = &self.tls_ca {
            cli.arg("--tls").arg("--cacert").arg(ca);
        }
        if let Some(i) = self.extra.iter().position(|a| a == "--requirepass") {
            cli.args(["-a", &self.extra[i + 1], "--no-auth-warning"]);
        }
        let out = cli.args(args).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// Another program writes `key` over with a plain string, whatever it held: the record a
    /// script must survive.
    pub fn write_over(&self, key: &str, value: &str) {
        self.cli(&["DEL", key]);
        self.cli(&["SET", key, value]);
    }

    /// Every key and its contents, order-free (not DUMP: a hash table's DUMP order changes as
    /// Redis rehashes it on reads): equal snapshots mean nothing changed.
    pub fn snapshot(&self) -> Vec<(String, String)> {
        let keys = self.cli(&["--scan"]).unwrap_or_default();
        let mut keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        keys.sort();
        let sorted = |text: Option<String>| {
            let mut lines: Vec<String> = text
                .unwrap_or_default()
                .lines()
                .map(str::to_owned)
                .collect();
            lines.sort();
            lines.join("\n")
        };
        keys.iter()
            .map(|k| {
                let value = match self.cli(&["TYPE", k]).as_deref() {
                    Some("hash") => sorted(self.cli(&["HGETALL", k])),
                    Some("set") => sorted(self.cli(&["SMEMBERS", k])),
                    Some("zset") => self
                        .cli(&["ZRANGE", k, "0", "-1", "WITHSCORES"])
                        .unwrap_or_default(),
                    Some("list") => self.cli(&["LRANGE", k, "0", "-1"]).unwrap_or_default(),
                    _ => self.cli(&["GET", k]).unwrap_or_default(),
                };
                (k.to_string(), value)
            })
            .collect()
    }

    /// Sends `signal` (`-STOP`, `-CONT`) to the server's process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a running server").id();
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {pid}");
    }

    /// Stops the server by pid (SIGKILL: nothing gets a chance to flush beyond what its
    /// persistence settings already wrote).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops, wipes its directory, and starts again empty.
    pub fn restart_empty(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).unwrap();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The machine's PostgreSQL (`.ci/run` starts it): `PALISADE_TEST_POSTGRES_URL`, default
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    std::env::var("PALISADE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema name no other test uses, and the sink URL that selects it. Names carry their
/// creation time; the first call of a test process drops test schemas over an hour old,
/// which tests that failed (or never drop theirs) left behind.
pub fn fresh_postgres_schema() -> (String, String) {
    static SWEEP: std::sync::Once = std::sync::Once::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    SWEEP.call_once(|| {
        let sql = format!(
            "DO $$ DECLARE s text; BEGIN FOR s IN SELECT nspname FROM pg_namespace \
             WHERE nspname ~ '^ts_[0-9]+_' AND split_part(nspname, '_', 2)::bigint < {} \
             LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END $$",
            now.saturating_sub(3600)
        );
        let _ = Command::new("psql")
            .args([postgres_url().as_str(), "-qc", &sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    });
    let id = uuid::Uuid::new_v4().simple().to_string();
    let schema = format!("ts_{now}_{}", &id[..12]);
    let url = format!("{}?schema={schema}", postgres_url());
    (schema, url)
}

/// Drops a test's schema (and everything in it) through the sink's own pool.
pub async fn drop_postgres_schema(sink: &palisade::PostgresSink) {
    let client = sink.pool().get().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", sink.schema()))
        .await
        .unwrap();
}

/// A private Redis Cluster on loopback: 3 masters, each with one replica, a 1-second node
/// timeout (a dead master's replica takes over within a few seconds), nothing on disk (or an
/// append-only file: [`RedisCluster::start_with_aof`]).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// The CA of a TLS cluster.
    ca: Option<PathBuf>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster whose nodes keep an append-only file fsynced on every write, so
    /// [`restart`](Self::restart) loses nothing.
    pub fn start_with_aof() -> Self {
        Self::start_as(None, true)
    }

    /// Kills every node (SIGKILL) and starts them again from their append-only files and
    /// cluster configs: the masters first, so no replica takes over with an older copy; then
    /// waits until the cluster is healthy.
    pub fn restart(&mut self) {
        let masters = self.masters();
        for node in &mut self.nodes {
            node.stop();
        }
        for &m in &masters {
            self.nodes[m].spawn();
        }
        for i in 0..self.nodes.len() {
            if !masters.contains(&i) {
                self.nodes[i].spawn();
            }
        }
        self.wait_until(
            |c| c.healthy(),
            "the restarted cluster never became healthy",
        );
    }

    /// A cluster that speaks only TLS, between its nodes too (`tls-cluster`,
    /// `tls-replication`), with certificates made here; its CA is [`RedisCluster::tls_ca`].
    pub fn start_tls() -> Self {
        let dir = std::env::temp_dir().join(format!("palisade-certs-{}", uuid::Uuid::new_v4()));
        Self::start_with(Some(Certificates::make(&dir)))
    }

    pub fn tls_ca(&self) -> &std::path::Path {
        self.ca.as_deref().expect("a TLS cluster")
    }

    fn start_with(certs: Option<Certificates>) -> Self {
        Self::start_as(certs, false)
    }

    fn start_as(certs: Option<Certificates>, aof: bool) -> Self {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                // The cluster bus gets its own free port (by default port + 10000, which
                // may be taken or past 65535).
                let bus = free_port().to_string();
                let tls = ["--tls-cluster", "yes", "--tls-replication", "yes"];
                let args = [
                    "--save",
                    "",
                    "--appendonly",
                    if aof { "yes" } else { "no" },
                    "--appendfsync",
                    "always",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    &bus,
                    // A replica whose master vanished a moment ago still takes over.
                    "--cluster-replica-validity-factor",
                    "0",
                ];
                match &certs {
                    Some(certs) => RedisServer::start_tls_with(&[&args[..], &tls].concat(), certs),
                    None => RedisServer::start_with(&args),
                }
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut cli = Command::new("redis-cli");
        if let Some(certs) = &certs {
            cli.arg("--tls").arg("--cacert").arg(&certs.ca);
        }
        let out = cli
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self {
            nodes,
            ca: certs.map(|c| c.ca),
        };
        cluster.wait_until(|c| c.healthy(), "the cluster never became healthy");
        cluster
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn target(&self) -> palisade::store::redis::Target {
        palisade::store::redis::cluster_with_ca(&self.urls(), self.ca.as_deref())
            .unwrap()
            .into()
    }

    /// Every live node sees the state ok and 3 masters that cover all slots, and every master
    /// has a replica attached and in sync (`state=online`: a replica still loading its first
    /// copy confirms no `WAIT`, which failed the failover test once in CI).
    pub fn healthy(&self) -> bool {
        let live: Vec<&RedisServer> = self.nodes.iter().filter(|n| n.child.is_some()).collect();
        live.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
        }) && {
            let masters = self.masters();
            masters.len() == 3
                && masters.iter().all(|&m| {
                    self.nodes[m]
                        .cli(&["INFO", "replication"])
                        .is_some_and(|r| {
                            r.contains("connected_slaves:1") && r.contains("state=online")
                        })
                })
        }
    }

    /// Indexes (into `nodes`) of the live nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].child.is_some()
                    && self.nodes[i]
                        .cli(&["ROLE"])
                        .is_some_and(|r| r.starts_with("master"))
            })
            .collect()
    }

    /// The live master serving `key` now (asked again for up to 10 s: a node's `redis-cli`
    /// can miss an answer on a loaded machine, and a failover may still be settling).
    pub fn master_of(&self, key: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(m) = self.try_master_of(key) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "no live master serves {key} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn try_master_of(&self, key: &str) -> Option<usize> {
        let slot: u16 = self.nodes[*self.masters().first()?]
            .cli(&["CLUSTER", "KEYSLOT", key])?
            .parse()
            .ok()?;
        // CLUSTER COUNTKEYSINSLOT answers on any node; a master's own CLUSTER NODES line
        // ("myself,master") lists the slot ranges it serves.
        for m in self.masters() {
            let nodes = self.nodes[m].cli(&["CLUSTER", "NODES"]).unwrap_or_default();
            let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
                continue;
            };
            let serves = me.split_whitespace().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
            });
            if serves {
                return Some(m);
            }
        }
        None
    }

    /// Kills node `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].stop();
    }

    /// Kills master `i` (SIGKILL) and waits until its replica has taken over: three masters
    /// again, and every live node sees the cluster ok.
    pub fn fail_over(&mut self, i: usize) {
        let doomed = self.nodes[i].port;
        self.kill(i);
        self.wait_until(
            |c| {
                c.masters().len() == 3
                    && c.nodes.iter().filter(|n| n.port != doomed).all(|n| {
                        n.cli(&["CLUSTER", "INFO"])
                            .is_some_and(|i| i.contains("cluster_state:ok"))
                    })
            },
            "no replica took over",
        );
    }

    pub fn wait_until(&self, ok: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if ok(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what} within 30 s");
    }
}

/// A private Redis Sentinel group on loopback: a master, one replica and three sentinels
/// (quorum 2) watching it as `name`, a 1-second down-after time, nothing on disk.
pub struct RedisSentinels {
    /// The two data nodes; either may be the master now.
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    pub name: String,
}

impl RedisSentinels {
    pub fn start() -> Self {
        let keep_nothing = ["--save", "", "--appendonly", "no"];
        let master = RedisServer::start_with(&keep_nothing);
        let port = master.port.to_string();
        let replica = RedisServer::start_with(
            &[&keep_nothing[..], &["--replicaof", "127.0.0.1", &port]].concat(),
        );
        let name = "palisade".to_string();
        let conf = format!(
            "sentinel monitor {name} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {name} 1000\n\
             sentinel failover-timeout {name} 5000\n\
             sentinel parallel-syncs {name} 1\n"
        );
        let sentinels = (0..3)
            .map(|_| RedisServer::start_as(&[], Some(&conf), Vec::new()))
            .collect();
        let group = Self {
            nodes: vec![master, replica],
            sentinels,
            name,
        };
        group.wait_until(|g| g.healthy(), "the sentinel group never became healthy");
        group
    }

    /// `redis+sentinel://` naming every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.name)
    }

    pub fn target(&self) -> palisade::store::redis::Target {
        palisade::store::redis::sentinel(&self.url(), None)
            .unwrap()
            .into()
    }

    /// The port every sentinel names as the master, if they agree.
    pub fn master_port(&self) -> Option<u16> {
        let mut named = self.sentinels.iter().map(|s| {
            s.cli(&["SENTINEL", "get-master-addr-by-name", &self.name])
                .and_then(|r| r.lines().nth(1).and_then(|p| p.trim().parse::<u16>().ok()))
        });
        let first = named.next()??;
        named.all(|p| p == Some(first)).then_some(first)
    }

    /// Index (into `nodes`) of the master the sentinels name.
    pub fn master(&self) -> usize {
        let port = self.master_port().expect("the sentinels agree on a master");
        self.nodes.iter().position(|n| n.port == port).unwrap()
    }

    /// The sentinels agree on a live master, know each other, and the other node replicates
    /// from it and is in sync.
    pub fn healthy(&self) -> bool {
        let Some(port) = self.master_port() else {
            return false;
        };
        let Some(master) = self.nodes.iter().find(|n| n.port == port) else {
            return false;
        };
        self.sentinels.iter().all(|s| {
            s.cli(&["SENTINEL", "master", &self.name])
                .is_some_and(|r| r.contains("num-other-sentinels\n2"))
        }) && master.cli(&["INFO", "replication"]).is_some_and(|r| {
            r.contains("role:master")
                && r.contains("connected_slaves:1")
                && r.contains("state=online")
        })
    }

    /// Kills the master (SIGKILL), waits until the sentinels have promoted the replica, then
    /// starts the old master again on its port, empty — where a client that kept its address
    /// finds a server that answers but, once the sentinels have demoted it, refuses writes —
    /// and waits until it replicates from the new master.
    pub fn fail_over(&mut self) {
        let old = self.master();
        let old_port = self.nodes[old].port;
        self.nodes[old].stop();
        self.wait_until(
            |g| g.master_port().is_some_and(|p| p != old_port),
            "the sentinels never promoted the replica",
        );
        self.nodes[old].restart_empty();
        self.wait_until(
            |g| g.healthy(),
            "the old master never rejoined as a replica",
        );
    }

    pub fn wait_until(&self, ok: impl Fn(&Self) -> bool, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if ok(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what} within 60 s");
    }
}

/// A private PostgreSQL server (`initdb` in a temporary directory, `postgres` on a free
/// loopback port, as the `postgres` user when the tests run as root) that accepts only TLS
/// connections (`hostssl`; plain ones are rejected by `pg_hba.conf`), with certificates made
/// here. Listens on 127.0.0.1 and 127.0.0.2 (a name its certificate does not carry). Stopped
/// by pid (SIGQUIT: immediate shutdown) when dropped.
pub struct PostgresTls {
    pub port: u16,
    pub certs: Certificates,
    dir: PathBuf,
    child: Option<Child>,
}

fn postgres_bin(name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (.ci/run installs it)")
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("no {name} under /usr/lib/postgresql"))
}

impl PostgresTls {
    pub fn start() -> Self {
        use std::os::unix::process::CommandExt;
        let dir = std::env::temp_dir().join(format!("palisade-pg-{}", uuid::Uuid::new_v4()));
        let certs = Certificates::make(&dir.join("certs"));
        // Postgres refuses to run as root: as root, hand the directory to `postgres`.
        let as_user = |command: &mut Command| {
            if Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
            {
                let id = |flag: &str| -> u32 {
                    let out = Command::new("id")
                        .args([flag, "postgres"])
                        .output()
                        .unwrap();
                    String::from_utf8_lossy(&out.stdout)
                        .trim()
                        .parse()
                        .expect("a postgres user")
                };
                command.uid(id("-u")).gid(id("-g"));
            }
        };
        let chown = |path: &std::path::Path| {
            let _ = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(path)
                .status();
        };
        std::fs::create_dir_all(&dir).unwrap();
        chown(&dir);
        let _ = Command::new("chmod").arg("600").arg(&certs.key).status();
        let data = dir.join("data");
        let mut initdb = Command::new(postgres_bin("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_user(&mut initdb);
        assert!(initdb.status().unwrap().success(), "initdb failed");
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.0/8 trust\nhostnossl all all 127.0.0.0/8 reject\n",
        )
        .unwrap();
        chown(&dir);
        let port = free_port();
        let file = |p: &std::path::Path| p.display().to_string();
        let mut postgres = Command::new(postgres_bin("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(&dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1,127.0.0.2",
                "-c",
                "ssl=on",
                "-c",
                "fsync=off",
            ])
            .args(["-c", &format!("ssl_cert_file={}", file(&certs.cert))])
            .args(["-c", &format!("ssl_key_file={}", file(&certs.key))])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_user(&mut postgres);
        let child = postgres.spawn().expect("postgres starts");
        let server = Self {
            port,
            certs,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let ready = Command::new(postgres_bin("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("private postgres on port {port} did not start");
    }

    /// The directory of its Unix socket (`pg_hba.conf`: `local all all trust`).
    pub fn socket_dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// `postgres://postgres@<host>:<port>/postgres?<query>`.
    pub fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres?{query}", self.port)
    }
}

impl Drop for PostgresTls {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-QUIT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private PgBouncer in front of the machine's PostgreSQL ([`postgres_url`]'s host and
/// database), in transaction mode (`pool_mode = transaction`: each transaction may get another
/// server connection, as behind most managed poolers), stopped by pid when dropped. `.ci/run`
/// installs `pgbouncer` where it is missing.
pub struct PgBouncer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl PgBouncer {
    /// Starts one whose server connections run `SET search_path TO <search_path>` when
    /// opened (a startup `options` parameter does not pass a transaction pooler), with
    /// `idle_transaction_timeout` so a client paused inside a transaction loses it, as the
    /// server's `idle_in_transaction_session_timeout` does without a pooler.
    pub fn start(search_path: &str) -> Self {
        let bin = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("pgbouncer is installed (.ci/run installs it with apt-get)");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("palisade-pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let upstream = postgres_url();
        let host_port = upstream
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or("127.0.0.1:5432");
        let (host, server_port) = host_port.split_once(':').unwrap_or((host_port, "5432"));
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let ini = format!(
            "[databases]\n\
             test = host={host} port={server_port} dbname=test user=postgres \
             connect_query='SET search_path TO {search_path}'\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             pool_mode = transaction\n\
             default_pool_size = 4\n\
             max_client_conn = 200\n\
             idle_transaction_timeout = 10\n\
             unix_socket_dir =\n\
             ignore_startup_parameters = extra_float_digits\n",
            users = dir.join("users.txt").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        let mut command = Command::new(bin);
        // (PgBouncer refuses to run as root; the machine's postgres user reads the files.)
        if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "postgres", dir.to_str().unwrap()])
                .status();
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{bin} runs: {e}"));
        let bouncer = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// A sink URL through it: schema `schema`, statements for a transaction pooler.
    pub fn sink_url(&self, schema: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/test?sslmode=disable&schema={schema}&pooler=transaction",
            self.port
        )
    }
}

/// Whether this process runs as root (uid 0, from /proc: no libc call).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
