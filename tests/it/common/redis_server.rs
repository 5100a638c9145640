//! Real `redis-server` processes for tests: foreground children on free loopback ports,
//! killed on drop. `scripts/test.sh` installs redis-server when it is missing.

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

    fn start_with(cluster: bool, extra: &[&str]) -> RedisServer {
        let mut dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let mut server = RedisServer {
                child: None,
                port: free_port(),
                dir,
                cluster,
                extra: extra.iter().map(|a| a.to_string()).collect(),
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
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.cluster {
            command.args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"]);
            command.args(["--cluster-config-file", "nodes.conf"]);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}): the Redis tests need it on PATH; \
                 scripts/test.sh installs it from Debian's packages, or run \
                 `apt-get install redis-server`"
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
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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

/// A Redis Cluster of three masters and no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_with(true, &[])).collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
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
