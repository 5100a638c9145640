//! The commands the Redis-protocol listener knows (names, arities and flags, as `COMMAND`
//! lists them), and what a command tells its connection to do next: the vocabulary the
//! connection ([`super::server`]) and the commands ([`super::commands`]) share.

/// The commands this server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Command {
    Throttle,
    RlThrottle,
    Gcra,
    Ping,
    Echo,
    Hello,
    Auth,
    Client,
    Commands,
    Select,
    Quit,
    Other,
}

/// Name, arity (negative: at least), flags, for `COMMAND`.
pub(super) const COMMANDS: [(Command, &str, i64, &str); 11] = [
    (Command::Throttle, "cl.throttle", -5, "write"),
    (Command::RlThrottle, "rl.throttle", -5, "write"),
    (Command::Gcra, "gcra", -5, "write"),
    (Command::Ping, "ping", -1, "fast"),
    (Command::Echo, "echo", 2, "fast"),
    (Command::Hello, "hello", -1, "fast"),
    (Command::Auth, "auth", -2, "fast"),
    (Command::Client, "client", -2, "fast"),
    (Command::Commands, "command", -1, "loading"),
    (Command::Select, "select", 2, "fast"),
    (Command::Quit, "quit", -1, "fast"),
];

impl Command {
    pub(super) fn of(name: &[u8]) -> Command {
        COMMANDS
            .iter()
            .find(|(_, text, _, _)| name.eq_ignore_ascii_case(text.as_bytes()))
            .map_or(Command::Other, |c| c.0)
    }

    /// Whether the command is refused (`LOADING`) while the first xDS update is awaited:
    /// as Redis while it loads its data, all but the connection's own commands (`HELLO`,
    /// `AUTH`, `CLIENT`, `COMMAND`, `SELECT`, `QUIT`) and unknown ones.
    pub(super) fn waits_for_limits(self) -> bool {
        matches!(
            self,
            Command::Throttle | Command::RlThrottle | Command::Gcra | Command::Ping | Command::Echo
        )
    }

    pub(super) fn label(self) -> &'static str {
        COMMANDS
            .iter()
            .find(|c| c.0 == self)
            .map_or("other", |c| c.1)
    }
}

/// What to do after a command.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    Close(&'static str),
}
