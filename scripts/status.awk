# Renders `ccattler get` output (KEY = VALUE lines) as the demo's tables:
# nodes with their capacity and what is placed on them, then instances.
function field(k) { return (k in v) ? v[k] : "-" }
{
  i = index($0, " = ")
  if (i == 0) next
  key = substr($0, 1, i - 1); val = substr($0, i + 3)
  v[key] = val
  n = split(key, p, "/")
  if (p[1] == "observed" && p[2] == "node" && p[4] == "cpu") nodes[p[3]] = 1
  if (p[1] == "effective" && p[2] == "instance" && p[4] == "service") insts[p[3]] = val
  if (p[1] == "observed" && p[2] == "node" && p[4] == "label") labels[p[3]] = labels[p[3]] p[5] "=" val " "
  if (p[1] == "effective" && p[2] == "service" && p[4] == "cpu") cpu[p[3]] = val
  if (p[1] == "effective" && p[2] == "service" && p[4] == "memory") mem[p[3]] = val
}
END {
  for (i in insts) { nd = v["placement/instance/" i]; if (nd != "") { ucpu[nd] += cpu[insts[i]]; umem[nd] += mem[insts[i]]; on[nd] = on[nd] i " " } }
  printf "%-8s %-12s %-11s %-11s %-8s %s\n", "NODE", "STATE", "CPU", "MEMORY", "LABELS", "INSTANCES"
  cmd = "sort"
  for (nd in nodes) printf "%-8s %-12s %-11s %-11s %-8s %s\n", nd, field("effective/node/" nd "/state"), ucpu[nd]+0 "/" v["observed/node/" nd "/cpu"], umem[nd]+0 "/" v["observed/node/" nd "/memory"], labels[nd], on[nd] | cmd
  close(cmd)
  print ""
  printf "%-9s %-8s %-8s %-9s %-10s %s\n", "INSTANCE", "SERVICE", "NODE", "STATE", "READINESS", "ENDPOINT"
  for (i in insts) printf "%-9s %-8s %-8s %-9s %-10s %s\n", i, insts[i], field("placement/instance/" i), field("effective/instance/" i "/state"), field("effective/instance/" i "/health"), field("endpoint/service/" insts[i] "/" i) | cmd
  close(cmd)
}
