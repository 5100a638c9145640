//! A real `memcached` for tests: a foreground child on a free loopback port
//! (`memcached -l 127.0.0.1 -p PORT -U 0`), killed on drop, and a raw text-protocol
//! client to look at what cellrate wrote. `scripts/test.sh` installs memcached from
//! Debian's packages when it is missing.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `memcached`.
pub struct Memcached {
    child: Option<Child>,
    pub port: u16,
}

impl Memcached {
    /// A server on a free port (tried again on another if the port was taken meanwhile).
    pub fn start() -> Memcached {
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut server = Memcached { child: None, port };
            if server.spawn() {
                return server;
            }
        }
        panic!("memcached did not start on a free port in 5 tries");
    }

    /// `host:port`, as MEMCACHE_HOST_PORT names it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("memcached")
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string(), "-U", "0"])
            // Read only when run as root, which memcached refuses without it.
            .args(["-u", "root"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start memcached ({e}): the memcache tests need it on PATH; \
                     scripts/test.sh installs it from Debian's packages, or run \
                     `apt-get install memcached`"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self
                .command("version\r\n")
                .is_some_and(|r| r.starts_with("VERSION"))
            {
                return true;
            }
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Sends `text` and reads the reply up to its end (`END`, or one line), at most 64 KiB.
    pub fn command(&self, text: &str) -> Option<String> {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        (&stream).write_all(text.as_bytes()).ok()?;
        let mut reader = BufReader::new(stream);
        let mut reply = String::new();
        let multi = text.starts_with("get ") || text.starts_with("stats");
        while reply.len() < 65_536 {
            let mut line = String::new();
            if reader.read_line(&mut line).ok()? == 0 {
                break;
            }
            reply.push_str(&line);
            if !multi || line == "END\r\n" {
                break;
            }
        }
        Some(reply)
    }

    /// The counter under `key`, if there is one.
    pub fn counter(&self, key: &str) -> Option<u64> {
        let reply = self.command(&format!("get {key}\r\n"))?;
        reply.lines().nth(1).and_then(|v| v.trim().parse().ok())
    }

    /// The seconds `key` has left to live (meta get's `t` flag; -1: never expires).
    pub fn ttl(&self, key: &str) -> Option<i64> {
        let reply = self.command(&format!("mg {key} t\r\n"))?;
        let flag = reply.split_whitespace().find(|w| w.starts_with('t'))?;
        flag[1..].parse().ok()
    }

    /// How many items memcached holds.
    pub fn items(&self) -> u64 {
        let stats = self.command("stats\r\n").unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix("STAT curr_items "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Kills the server (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn(),
            "memcached did not restart on port {}",
            self.port
        );
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}
