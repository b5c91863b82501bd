# Folds `perf script -F comm,ip,sym,dso` output of the daemon (call graphs) into CPU per
# stage, for scripts/profile.sh.
#
# A sample's stage is that of its outermost frame (nearest the thread's root) that names a
# stage's module: for async code, the stage's own future (an `async fn`'s `{{closure}}`)
# as the runtime polls it, so work a stage does through shared code (the store, diesel,
# tokio-postgres, rdkafka) is the stage's. Samples with no stage frame are split by what
# runs (the Kafka consumers' shared driver, the HTTP server's middleware and its other
# endpoints, the PostgreSQL connection tasks, which serve every stage's queries, the rest) and by thread name: librdkafka's own threads (rdk:*),
# the producers' polling threads, the actix system thread (`tally`), the HTTP workers.
# Within each stage, the share of each library where the sample landed (its innermost
# frame), largest first.

function stage_of(s) {
  if (s ~ /tally_engine::http::intake|tally_actors::store::idempotency/) return "intake (HTTP POST /transfers)"
  if (s ~ /tally_actors::outbox::/) return "outbox relay"
  if (s ~ /tally_actors::antifraud::|tally_engine::stages::antifraud/) return "antifraud"
  if (s ~ /tally_actors::ledger::|tally_engine::stages::ledger/) return "ledger"
  if (s ~ /tally_actors::projection::|tally_engine::stages::projection/) return "projection"
  if (s ~ /tally_actors::notify::|tally_engine::stages::notifications/) return "notifications"
  if (s ~ /tally_actors::orders::|tally_engine::stages::orders/) return "orders"
  return ""
}

# The library a frame is in: the crate of a Rust symbol, else librdkafka, the kernel, libc.
function library_of(s, dso) {
  if (dso ~ /kernel/) return "kernel"
  if (dso == "[vdso]") return "vdso (clock_gettime)"
  if (s ~ /^rd_|^rdk/) return "librdkafka"
  if (dso ~ /libc[.-]/) return "libc"
  sub(/^(<|&|\(|core::ptr::drop_in_place<)+/, "", s)
  if (s ~ /::/) { sub(/::.*/, "", s); return s }
  if (s == "" || s ~ /unknown/) return "unknown"
  return "C in " dso
}

function flush(    i, stage, consume, http, leaf, kind) {
  if (n == 0) return
  stage = ""; consume = 0; http = 0
  for (i = n; i >= 1 && stage == ""; i--) {
    stage = stage_of(sym[i])
    if (sym[i] ~ /tally_actors::consume::/) consume = 1
    if (sym[i] ~ /tally_engine::http::/) http = 1
  }
  if (stage == "") {
    for (i = 1; i <= n; i++) if (sym[i] ~ /tokio_postgres::|diesel/) break
    if (consume) stage = "Kafka consumers' driver"
    else if (http) stage = "HTTP middleware and other endpoints"
    else if (i <= n) stage = "PostgreSQL connections"
    else stage = "no stage frame"
    kind = comm; gsub(/[0-9]/, "", kind)
    stage = stage " [" kind "]"
  }
  leaf = library_of(sym[1], dso[1])
  total++; by_stage[stage]++; by_lib[stage SUBSEP leaf]++
  n = 0
}

# A sample: a header line (the thread's name first), its frames (a tab first, the leaf
# first), a blank line.
/^[ \t]*$/ { flush(); next }
/^[^\t]/ { flush(); comm = $0; sub(/^[ \t]+/, "", comm); sub(/[ \t]+$/, "", comm); next }
{
  line = $0
  sub(/^[ \t]*[0-9a-f]+ /, "", line)
  d = line; sub(/.*\(/, "", d); sub(/\)[ \t]*$/, "", d); sub(/.*\//, "", d)
  sub(/ \([^(]*\)[ \t]*$/, "", line)
  sub(/\+0x[0-9a-f]+$/, "", line)
  n++; sym[n] = line; dso[n] = d
}

END {
  flush()
  if (total == 0) { print "no samples"; exit }
  printf "%d samples of the daemon, with call graphs\n", total
  printf "%-56s %6s   %s\n", "stage [thread, when no stage frame]", "CPU", "where it landed (library of the innermost frame)"
  cmd = "sort -t '\t' -k1,1nr | cut -f2-"
  for (s in by_stage) {
    # This stage's libraries of at least 4%, largest first.
    m = 0
    for (k in by_lib) {
      split(k, part, SUBSEP)
      if (part[1] != s || by_lib[k] * 100 < by_stage[s] * 4) continue
      m++; lib[m] = part[2]; cnt[m] = by_lib[k]
      for (j = m; j > 1 && cnt[j] > cnt[j - 1]; j--) {
        t = cnt[j]; cnt[j] = cnt[j - 1]; cnt[j - 1] = t
        t = lib[j]; lib[j] = lib[j - 1]; lib[j - 1] = t
      }
    }
    libs = ""
    for (j = 1; j <= m; j++) libs = libs sprintf("%s%s %.0f%%", (j == 1 ? "" : ", "), lib[j], 100 * cnt[j] / by_stage[s])
    printf "%d\t%-56s %5.1f%%   %s\n", by_stage[s], s, 100 * by_stage[s] / total, libs | cmd
  }
  close(cmd)
}
