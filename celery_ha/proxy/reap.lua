--[[ Empty the in-use zone of leases whose borrower died, and drop proxies whose lifetime ended.
  Acquire does a bounded amount of this on every call; this script is for maintenance.
  KEYS[1] the available zone
  Same slot: the keys it builds (all, blk:<domain>, dban:<domain>, exp, gen, grp, iu, m:<id>, new, pb,
    pd:<id>, stats, tb, tomb:<id>, each under cha:{ns}:px:) are named from ARGV[1], the prefix KEYS[1] starts with ({hash tag} included), so they share
    KEYS[1]'s slot (_common checks it).
  ARGV[1] the pool's key prefix
  ARGV[2] the most leases (and, separately, expired proxies, due temporary bans and waiting new
    proxies) to handle
  ARGV[3] '1': no health check configured, so temporary bans whose time is up end now and the proxies
    waiting in 'new' (added with verify) are admitted unchecked
  ARGV[4] score constants (scoring.py SCORE_ARG)
  Reply: the number of leases reaped
]]
--#include _common
return housekeeping(ARGV[1], now_ms(), tonumber(ARGV[2]), ARGV[3] == '1', numargs(ARGV[4]))
