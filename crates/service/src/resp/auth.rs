//! `HELLO` and `AUTH` on the Redis-protocol listener: the protocol version, the client's
//! name, and the token (with a token set, every command but `AUTH`, `HELLO` and `QUIT` needs
//! the connection to have authenticated; [`MAX_AUTH_FAILURES`] wrong tokens close it, and an
//! address that gave too many across its connections is refused for a while, see
//! [`super::lockout`]).

use super::command::Flow;
use super::commands::{arity, client_name, fail, Failure};
use super::server::{Connection, RespServer};

/// Wrong tokens a connection may give before it is closed.
pub const MAX_AUTH_FAILURES: u32 = 3;

impl RespServer {
    /// `HELLO [protover [AUTH username password] [SETNAME name]]`.
    pub(super) fn hello(&self, conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
        let mut resp3 = conn.replies.resp3;
        if let Some(version) = args.get(1) {
            match std::str::from_utf8(version)
                .ok()
                .and_then(|v| v.parse::<i64>().ok())
            {
                Some(2) => resp3 = false,
                Some(3) => resp3 = true,
                Some(_) => return Err(fail("NOPROTO unsupported protocol version")),
                None => {
                    return Err(fail(
                        "ERR Protocol version is not an integer or out of range",
                    ))
                }
            }
        }
        let mut auth = None;
        let mut name = None;
        let mut at = 2;
        while at < args.len() {
            let option = &args[at];
            if option.eq_ignore_ascii_case(b"AUTH") && at + 2 < args.len() {
                auth = Some((&args[at + 1], &args[at + 2]));
                at += 3;
            } else if option.eq_ignore_ascii_case(b"SETNAME") && at + 1 < args.len() {
                name = Some(&args[at + 1]);
                at += 2;
            } else {
                return Err(fail(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        if let Some((user, password)) = auth {
            self.check_token(conn, Some(*user), password)?;
        }
        if !conn.authenticated {
            return Err(fail(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            ));
        }
        if let Some(name) = name {
            conn.name = Some(client_name(name)?);
        }
        conn.replies.resp3 = resp3;
        let r = &mut conn.replies;
        r.map(7);
        r.bulk(b"server");
        r.bulk(b"cellrate");
        r.bulk(b"version");
        r.bulk(env!("CARGO_PKG_VERSION").as_bytes());
        r.bulk(b"proto");
        r.integer(if resp3 { 3 } else { 2 });
        r.bulk(b"id");
        r.integer(conn.id as i64);
        r.bulk(b"mode");
        r.bulk(b"standalone");
        r.bulk(b"role");
        r.bulk(b"master");
        r.bulk(b"modules");
        r.array(0);
        Ok(())
    }

    /// `AUTH [username] password`.
    pub(super) fn auth(&self, conn: &mut Connection, args: &[&[u8]]) -> Result<(), Failure> {
        let (user, password) = match args {
            [_, password] => (None, password),
            [_, user, password] => (Some(*user), password),
            _ => return Err(arity("auth")),
        };
        if self.token.is_none() {
            return Err(fail(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            ));
        }
        self.check_token(conn, user, password)?;
        conn.replies.simple("OK");
        Ok(())
    }

    /// Authenticates the connection if `password` is the token (user `default`, if given).
    fn check_token(
        &self,
        conn: &mut Connection,
        user: Option<&[u8]>,
        password: &[u8],
    ) -> Result<(), Failure> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        if let Err(wait) = self.lockout.check(conn.peer) {
            // Not compared: a locked-out guesser learns nothing from its guess.
            tracing::warn!(
                connection = conn.id,
                peer = %conn.peer,
                "redis protocol: too many wrong tokens from this address; closing the connection"
            );
            return Err(Failure(
                format!(
                    "ERR too many wrong tokens from this address; retry in {} s",
                    wait.as_secs().max(1)
                ),
                Flow::Close("auth_locked"),
            ));
        }
        let user_ok = user.is_none_or(|u| u == b"default");
        if token.matches(password) && user_ok {
            conn.authenticated = true;
            return Ok(());
        }
        self.lockout.failed(conn.peer);
        conn.auth_failures += 1;
        let flow = if conn.auth_failures >= MAX_AUTH_FAILURES {
            tracing::warn!(
                connection = conn.id,
                failures = conn.auth_failures,
                "redis protocol: wrong tokens; closing the connection"
            );
            Flow::Close("auth_failures")
        } else {
            Flow::Continue
        };
        Err(Failure(
            "WRONGPASS invalid username-password pair or user is disabled.".to_string(),
            flow,
        ))
    }
}
