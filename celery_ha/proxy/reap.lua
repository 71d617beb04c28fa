--#include _common
-- Empty the in-use zone of leases whose borrower died, and drop proxies whose lifetime ended.
-- (Acquire does a bounded amount of this on every call; this script is for maintenance.)
-- KEYS[1] = available zone; ARGV: 1 prefix, 2 limit. Returns the number of leases reaped.
return housekeeping(ARGV[1], now_ms(), tonumber(ARGV[2]))
