//! The Lua scripts the shared cache runs in Redis, each one atomic step.

/// Stores an answer only if the resource's generation is the one the reader
/// saw, and keeps the key alive as long as its longest-lived field.
pub(super) const STORE: &str = r"
local g = redis.call('GET', KEYS[2]) or '0'
if g ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local life = tonumber(ARGV[4])
local left = redis.call('PTTL', KEYS[1])
if left < life then redis.call('PEXPIRE', KEYS[1], life) end
return 1
";

/// Stores a derived-data record (`context::derived`) next to its contents:
/// only while the contents' hash exists (an invalidation deletes both), and
/// only if it adds something (byte 1 is its kind, bytes 2..33 its head
/// digest): another head, or chunks where counts alone were stored.
pub(super) const STORE_DERIVED: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.sub(cur, 2, 33) == string.sub(ARGV[2], 2, 33)
  and string.byte(cur, 1) >= string.byte(ARGV[2], 1) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
";

/// The lookup and the lock in one step: the user's private answer and the
/// public one (`KEYS[1]`, fields `ARGV[1]` and `p`), the generation
/// (`KEYS[2]`) and, when neither answer is live, `SET NX PX` on the lock
/// (`KEYS[3]`, value `ARGV[3]`, life `ARGV[4]` ms). The fourth value says
/// 0: an answer is live (`ARGV[2]` is the time now, in ms; a value starts
/// with its expiry, `{"x":…`); 1: the lock is this replica's now; 2:
/// another holds it.
pub(super) const CLAIM: &str = r#"
local v = redis.call('HMGET', KEYS[1], ARGV[1], 'p')
local g = redis.call('GET', KEYS[2]) or '0'
local now = tonumber(ARGV[2])
for i = 1, 2 do
  if v[i] then
    local x = tonumber(string.match(v[i], '^{"x":(%d+)'))
    if x == nil or x > now then return {v[1], v[2], g, 0} end
  end
end
if redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ARGV[4]) then return {v[1], v[2], g, 1} end
return {v[1], v[2], g, 2}
"#;

/// Releases the lock only if this replica still holds it.
pub(super) const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";
