//! One server-side call of the store: `EVALSHA` of its script, or the same keys and
//! arguments sent to cellrate's Redis module (`CELLRATE.BATCH`, crates/module), which
//! decides them with cellrate's core instead of Lua and answers exactly as the script does
//! (docs/redis-store.md, "The module").
//!
//! Whether the module is used is `--redis-module` ([`RedisModule`](super::RedisModule)):
//! `auto` asks the server at start (a module call of no key, to every master of a
//! cluster) and uses the module when every one has it, asking again once a call is
//! answered if the server gave no answer at start. A call the server answers "unknown
//! command" (the module unloaded, a failover to a server without it) is sent again as the
//! script, which it never ran; an answer that cannot be read (the same, echoing arguments
//! that are no UTF-8) fails its call; either way the store keeps to the script from then
//! on. The settlement ledger follows what the store found.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use redis::{FromRedisValue, RedisResult, ToRedisArgs};

use super::RedisModule;

/// The script, compiled into the binary.
pub(super) const BATCH_SCRIPT: &str = include_str!("batch.lua");

/// The module's command for `settle.lua`'s calls (the settlement ledger).
pub(super) const SETTLE_COMMAND: &str = "CELLRATE.SETTLE";

/// The module's command for `batch.lua`'s calls.
pub(super) const BATCH_COMMAND: &str = "CELLRATE.BATCH";

/// What the store knows of the server's module: not asked yet, there, or not.
pub(super) struct ModuleUse {
    setting: RedisModule,
    state: AtomicU8,
}

const UNKNOWN: u8 = 0;
const THERE: u8 = 1;
const ABSENT: u8 = 2;
/// Not known, and a question on its way.
const ASKING: u8 = 3;

impl ModuleUse {
    /// With `auto`, the script until the question at start finds the module.
    pub(super) fn new(setting: RedisModule) -> ModuleUse {
        ModuleUse {
            setting,
            state: AtomicU8::new(UNKNOWN),
        }
    }

    pub(super) fn setting(&self) -> RedisModule {
        self.setting
    }

    /// Whether the next call goes to the module (with `auto`, a call the server does not
    /// know is sent again as the script).
    pub(super) fn used(&self) -> bool {
        match (self.setting, self.state.load(Ordering::Relaxed)) {
            (RedisModule::Require, _) => true,
            (RedisModule::Auto, state) => state == THERE,
            (RedisModule::Forbid, _) => false,
        }
    }

    /// What the server said it has; `None`: no answer (Redis down at start), asked again
    /// after the next call the script's server answers ([`ModuleUse::ask_again`]).
    pub(super) fn found(&self, there: Option<bool>) {
        let state = match there {
            Some(true) => THERE,
            Some(false) => ABSENT,
            None => UNKNOWN,
        };
        self.state.store(state, Ordering::Relaxed);
    }

    /// With `auto`, whether the server should be asked again (it gave no answer at start,
    /// and has answered a call since): `true` once, until that question is answered.
    pub(super) fn ask_again(&self) -> bool {
        self.setting == RedisModule::Auto
            && self
                .state
                .compare_exchange(UNKNOWN, ASKING, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// A module call whose answer could not be read (maybe the server not knowing it, in
    /// words that are not UTF-8): with `auto`, the script from now on; the call itself
    /// failed (it may have run, so it is not sent again).
    pub(super) fn unreadable_answer(&self, module_call: bool) {
        if module_call
            && self.setting == RedisModule::Auto
            && self.state.swap(ABSENT, Ordering::Relaxed) == THERE
        {
            tracing::warn!(
                "redis: a call of cellrate's module was answered with what cannot be \
                 read (is the module still loaded?): deciding with the script from now on"
            );
        }
    }

    /// A call the server did not know: with `auto`, the script from now on, and the call
    /// is sent again as the script (`true`); logged when the module was there before.
    pub(super) fn unknown_command(&self) -> bool {
        if self.setting != RedisModule::Auto {
            return false;
        }
        if self.state.swap(ABSENT, Ordering::Relaxed) == THERE {
            tracing::warn!(
                "redis: the server does not know cellrate's module's commands (it is not \
                 loaded there now): deciding with the script from now on"
            );
        }
        true
    }
}

/// Whether an answer is, or holds, an error (a master of a cluster that answered one).
pub(super) fn holds_an_error(value: &redis::Value) -> bool {
    match value {
        redis::Value::ServerError(_) => true,
        redis::Value::Array(values) | redis::Value::Set(values) => {
            values.iter().any(holds_an_error)
        }
        redis::Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| holds_an_error(k) || holds_an_error(v)),
        _ => false,
    }
}

/// Whether an error's text is an answer that could not be read as text: the server's
/// "unknown command" echoes the call's first arguments, which may not be UTF-8 (a kept
/// Check's bytes), and redis-rs then reports a parse error instead of the server's.
pub(super) fn unreadable(text: &str) -> bool {
    text.contains("invalid utf-8")
}

/// Whether an error's text is the server not knowing one of the module's commands.
pub(super) fn unknown_command(text: &str) -> bool {
    let upper = text.to_ascii_uppercase();
    upper.contains("UNKNOWN COMMAND") && upper.contains("CELLRATE.")
}

/// A call being built: keys and arguments, for the script or the module.
pub(super) enum Invocation<'s> {
    Script(redis::ScriptInvocation<'s>),
    /// The module's `command`, and the cluster slot its keys are in (it is routed there:
    /// a client does not know which of its arguments are keys).
    Module {
        command: &'static str,
        slot: usize,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
    },
}

impl<'s> Invocation<'s> {
    /// A call of `script`, or of the module's `command` when `module`.
    pub(super) fn new(
        script: &'s redis::Script,
        module: bool,
        command: &'static str,
        slot: usize,
    ) -> Self {
        match module {
            false => Invocation::Script(script.prepare_invoke()),
            true => Invocation::Module {
                command,
                slot,
                keys: Vec::new(),
                args: Vec::new(),
            },
        }
    }

    pub(super) fn is_module(&self) -> bool {
        matches!(self, Invocation::Module { .. })
    }

    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        match self {
            Invocation::Script(invocation) => {
                invocation.key(key);
            }
            Invocation::Module { keys, .. } => key.write_redis_args(keys),
        }
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        match self {
            Invocation::Script(invocation) => {
                invocation.arg(arg);
            }
            Invocation::Module { args, .. } => arg.write_redis_args(args),
        }
        self
    }

    /// A module call as the script's (one the server did not know); `None` for a script's.
    pub(super) fn as_script(&self, script: &'s redis::Script) -> Option<Invocation<'s>> {
        match self {
            Invocation::Script(_) => None,
            Invocation::Module { keys, args, .. } => {
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(key.as_slice());
                }
                for arg in args {
                    invocation.arg(arg.as_slice());
                }
                Some(Invocation::Script(invocation))
            }
        }
    }

    fn command(&self) -> Option<(redis::Cmd, usize)> {
        let Invocation::Module {
            command,
            slot,
            keys,
            args,
        } = self
        else {
            return None;
        };
        let mut cmd = redis::cmd(command);
        cmd.arg(keys.len());
        for part in keys.iter().chain(args) {
            cmd.arg(part.as_slice());
        }
        Some((cmd, *slot))
    }

    /// Runs the call on a connection to one server.
    pub(super) async fn invoke_async<T: FromRedisValue>(
        &self,
        connection: &mut (impl redis::aio::ConnectionLike + Send),
    ) -> RedisResult<T> {
        match self {
            Invocation::Script(invocation) => invocation.invoke_async(connection).await,
            Invocation::Module { .. } => {
                let (cmd, _) = self.command().expect("a module call");
                cmd.query_async(connection).await
            }
        }
    }

    /// Runs the call on a cluster: a module call to the master of its slot.
    pub(super) async fn invoke_cluster<T: FromRedisValue>(
        &self,
        connection: &mut redis::cluster_async::ClusterConnection,
    ) -> RedisResult<T> {
        use redis::cluster_routing::{
            MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
        };
        match self.command() {
            None => self.invoke_async(connection).await,
            Some((cmd, slot)) => {
                let routing = match self {
                    // A call of no key (the start's question) asks every master.
                    Invocation::Module { keys, .. } if keys.is_empty() => {
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None))
                    }
                    _ => RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                        slot as u16,
                        SlotAddr::Master,
                    ))),
                };
                let value = connection.route_command(cmd, routing).await?;
                T::from_redis_value(value).map_err(Into::into)
            }
        }
    }
}

impl super::RedisStore {
    /// A call of the script, or of the module when it is used, for keys in `slot`.
    pub(super) fn invocation(&self, slot: usize) -> Invocation<'_> {
        Invocation::new(&self.script, self.module.used(), BATCH_COMMAND, slot)
    }
}

/// Values numbered from 1 in their order of first appearance: a call's shapes.
pub(super) struct Dedup<T> {
    pub(super) order: Vec<T>,
    /// foldhash, randomly seeded per process: SipHash cost ~400 instructions a shape, one
    /// per item of a call.
    index: HashMap<T, usize, foldhash::fast::RandomState>,
    /// Whether `index` is kept: a few values are found faster by a scan.
    mapped: bool,
}

impl<T: Copy + Eq + std::hash::Hash> Dedup<T> {
    pub(super) fn new(items: usize) -> Dedup<T> {
        Dedup {
            order: Vec::with_capacity(items),
            index: HashMap::default(),
            mapped: items > 8,
        }
    }

    /// The number of `value`, added if new.
    pub(super) fn index(&mut self, value: T) -> usize {
        let known = if self.mapped {
            self.index.get(&value).copied()
        } else {
            self.order.iter().position(|v| *v == value).map(|i| i + 1)
        };
        known.unwrap_or_else(|| {
            self.order.push(value);
            if self.mapped {
                self.index.insert(value, self.order.len());
            }
            self.order.len()
        })
    }
}
