//! The settlement ledger's keys as `settle.lua` reads and writes them, one server command
//! per `redis.call` of the script, in the script's order, so that both leave the same
//! hashes and sorted sets (the same fields in the same order, the same scores and TTLs).
//! Each write goes through `RM_Call` with the `!` flag: replicated as its effect (Redis
//! rewrites a relative expiry to an absolute one), inside the command's MULTI/EXEC.

use redis_module::{
    CallOptions, CallOptionsBuilder, CallReply, CallResult, Context, KeyType, RedisError,
};

/// A field of a record, or none (Lua's `false`, a null reply).
pub(super) type Field = Option<Vec<u8>>;

/// The keys of one call (settle.lua's KEYS) and the time of Redis it runs at.
pub(super) struct Ledger<'a> {
    ctx: &'a Context,
    keys: Vec<&'a [u8]>,
    /// Milliseconds of Redis `TIME`.
    pub(super) now: i64,
    /// Microseconds of Redis `TIME`, as the script writes them: seconds, then six digits.
    pub(super) now_us: Vec<u8>,
    read: CallOptions,
    write: CallOptions,
}

fn unexpected() -> RedisError {
    RedisError::Str("ERR CELLRATE.SETTLE: an unexpected reply from the server")
}

/// A reply as an integer.
fn integer(reply: &CallReply) -> Result<i64, RedisError> {
    match reply {
        CallReply::I64(i) => Ok(i.to_i64()),
        _ => Err(unexpected()),
    }
}

/// A reply as a bulk string, or none.
fn field(reply: &CallReply) -> Result<Field, RedisError> {
    match reply {
        CallReply::String(s) => Ok(Some(s.as_bytes().to_vec())),
        CallReply::Null(_) => Ok(None),
        _ => Err(unexpected()),
    }
}

/// A reply as an array of bulk strings (or nulls).
fn fields(reply: CallResult) -> Result<Vec<Field>, RedisError> {
    match reply.map_err(RedisError::from)? {
        CallReply::Array(array) => array
            .iter()
            .map(|item| field(&item.map_err(RedisError::from)?))
            .collect(),
        _ => Err(unexpected()),
    }
}

/// The SHA-1 of `key` in lowercase hex, as `redis.sha1hex` gives it.
fn sha1hex(key: &[u8]) -> String {
    sha1_smol::Sha1::from(key).digest().to_string()
}

/// The parts of a record's `b` field: its runs of bytes between newlines (Lua's
/// `gmatch('[^\n]+')`).
pub(super) fn lines(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    b.split(|&c| c == b'\n').filter(|part| !part.is_empty())
}

impl<'a> Ledger<'a> {
    /// The ledger of `keys`, at the time `TIME` reads now.
    pub(super) fn new(ctx: &'a Context, keys: Vec<&'a [u8]>) -> Result<Ledger<'a>, RedisError> {
        let read = CallOptionsBuilder::new().errors_as_replies().build();
        let write = CallOptionsBuilder::new()
            .errors_as_replies()
            .replicate()
            .build();
        let time = fields(ctx.call_ext::<_, CallResult>("TIME", &read, &[] as &[&[u8]]))?;
        let number = |i: usize| -> Option<(i64, &[u8])> {
            let text = time.get(i)?.as_deref()?;
            Some((std::str::from_utf8(text).ok()?.parse().ok()?, text))
        };
        let ((seconds, seconds_text), (micros, _)) = (
            number(0).ok_or_else(unexpected)?,
            number(1).ok_or_else(unexpected)?,
        );
        let mut now_us = seconds_text.to_vec();
        now_us.extend_from_slice(format!("{micros:06}").as_bytes());
        Ok(Ledger {
            ctx,
            keys,
            now: seconds * 1000 + micros / 1000,
            now_us,
            read,
            write,
        })
    }

    /// KEYS[i + 1] (empty when the call gave fewer: the op's minimum keeps it unused).
    pub(super) fn key(&self, i: usize) -> &'a [u8] {
        self.keys.get(i).copied().unwrap_or_default()
    }

    pub(super) fn index(&self) -> &'a [u8] {
        self.key(0)
    }

    pub(super) fn record(&self) -> &'a [u8] {
        self.key(1)
    }

    pub(super) fn holds(&self) -> &'a [u8] {
        self.key(2)
    }

    pub(super) fn queue(&self) -> &'a [u8] {
        self.key(4)
    }

    /// The key of the live holds counted against bucket key `name` (KEYS[4] .. name).
    pub(super) fn per_key(&self, name: &[u8]) -> Vec<u8> {
        [self.key(3), name].concat()
    }

    fn run(&self, options: &CallOptions, command: &str, args: &[&[u8]]) -> CallResult<'static> {
        self.ctx.call_ext::<_, CallResult>(command, options, args)
    }

    /// A command that reads.
    pub(super) fn read(
        &self,
        command: &str,
        args: &[&[u8]],
    ) -> Result<CallReply<'static>, RedisError> {
        self.run(&self.read, command, args)
            .map_err(RedisError::from)
    }

    /// A command that writes, replicated as it is (its effect).
    pub(super) fn write(
        &self,
        command: &str,
        args: &[&[u8]],
    ) -> Result<CallReply<'static>, RedisError> {
        self.run(&self.write, command, args)
            .map_err(RedisError::from)
    }

    pub(super) fn read_int(&self, command: &str, args: &[&[u8]]) -> Result<i64, RedisError> {
        integer(&self.read(command, args)?)
    }

    pub(super) fn write_int(&self, command: &str, args: &[&[u8]]) -> Result<i64, RedisError> {
        integer(&self.write(command, args)?)
    }

    pub(super) fn read_field(&self, command: &str, args: &[&[u8]]) -> Result<Field, RedisError> {
        field(&self.read(command, args)?)
    }

    pub(super) fn read_fields(
        &self,
        command: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Field>, RedisError> {
        fields(self.run(&self.read, command, args))
    }

    pub(super) fn write_fields(
        &self,
        command: &str,
        args: &[&[u8]],
    ) -> Result<Vec<Field>, RedisError> {
        fields(self.run(&self.write, command, args))
    }

    /// The type of key `k` (`TYPE`, without touching it).
    pub(super) fn type_of(&self, k: &[u8]) -> KeyType {
        self.ctx.open_key(&self.ctx.create_string(k)).key_type()
    }

    /// The state of record `k`, or none when there is none (or it is no hash).
    pub(super) fn state_of(&self, k: &[u8]) -> Result<Field, RedisError> {
        if self.type_of(k) != KeyType::Hash {
            return Ok(None);
        }
        self.read_field("HGET", &[k, b"s"])
    }

    /// The bucket keys record `k` counts against while it is a live hold.
    fn keys_of(&self, k: &[u8]) -> Result<Vec<Vec<u8>>, RedisError> {
        if self.type_of(k) != KeyType::Hash {
            return Ok(Vec::new());
        }
        let b = self.read_field("HGET", &[k, b"b"])?.unwrap_or_default();
        Ok(lines(&b).map(<[u8]>::to_vec).collect())
    }

    /// Counts record `k` (a live hold) against its keys, until its key expires.
    pub(super) fn count(&self, k: &[u8]) -> Result<(), RedisError> {
        let left = self.read_int("PTTL", &[k])?;
        if left <= 0 {
            return Ok(());
        }
        let (until, member) = ((self.now + left).to_string(), sha1hex(k));
        let left_text = left.to_string();
        for b in self.keys_of(k)? {
            let z = self.per_key(&b);
            self.write("ZADD", &[&z, until.as_bytes(), member.as_bytes()])?;
            if self.read_int("PTTL", &[&z])? < left {
                self.write("PEXPIRE", &[&z, left_text.as_bytes()])?;
            }
        }
        Ok(())
    }

    /// Stops counting record `k` (no longer a live hold).
    fn uncount(&self, k: &[u8]) -> Result<(), RedisError> {
        let member = sha1hex(k);
        for b in self.keys_of(k)? {
            self.write("ZREM", &[&self.per_key(&b), member.as_bytes()])?;
        }
        Ok(())
    }

    /// Takes record `k` out of the queue of anonymous holds it is in (its field q), if any.
    fn dequeue(&self, k: &[u8]) -> Result<(), RedisError> {
        if self.type_of(k) == KeyType::Hash {
            if let Some(q) = self.read_field("HGET", &[k, b"q"])? {
                self.write("ZREM", &[&q, k])?;
                self.write("HDEL", &[k, b"q"])?;
            }
        }
        Ok(())
    }

    /// Takes record `k` out of the live holds (when it was one) and out of its queue and
    /// counts; true if it was one.
    pub(super) fn release(&self, k: &[u8]) -> Result<bool, RedisError> {
        if self.write_int("ZREM", &[self.holds(), k])? != 1 {
            return Ok(false);
        }
        self.dequeue(k)?;
        self.uncount(k)?;
        Ok(true)
    }

    /// Moves record `k` from the live holds to the index, by when its key expires.
    pub(super) fn unhold(&self, k: &[u8]) -> Result<(), RedisError> {
        if self.release(k)? {
            let left = self.read_int("PTTL", &[k])?;
            if left > 0 {
                let until = (self.now + left).to_string();
                self.write("ZADD", &[self.index(), until.as_bytes(), k])?;
            }
        }
        Ok(())
    }

    /// Whether `k` is in the live holds.
    pub(super) fn held(&self, k: &[u8]) -> Result<bool, RedisError> {
        Ok(self.read_field("ZSCORE", &[self.holds(), k])?.is_some())
    }

    /// An error (WRONGTYPE) unless `k` is a sorted set or no key.
    pub(super) fn sorted_set_or_none(&self, k: &[u8]) -> Result<(), RedisError> {
        match self.type_of(k) {
            KeyType::Empty | KeyType::ZSet => Ok(()),
            _ => Err(RedisError::WrongType),
        }
    }

    /// Before record `k` is counted: an error unless each of its keys' sets is a sorted
    /// set or none (so that the script's mid-way WRONGTYPE becomes one before any write).
    pub(super) fn guard_counts(&self, k: &[u8]) -> Result<(), RedisError> {
        for b in self.keys_of(k)? {
            self.sorted_set_or_none(&self.per_key(&b))?;
        }
        Ok(())
    }

    /// Before record `k` leaves the live holds: its counts' sets and its queue.
    pub(super) fn guard_release(&self, k: &[u8]) -> Result<(), RedisError> {
        self.guard_counts(k)?;
        if self.type_of(k) == KeyType::Hash {
            if let Some(q) = self.read_field("HGET", &[k, b"q"])? {
                self.sorted_set_or_none(&q)?;
            }
        }
        Ok(())
    }
}
