#!/usr/bin/env bash
# Podman (4.x) runs a container's health checks from systemd timers; where systemd is not
# init (containers, CI sandboxes) they never run, a service stays "starting" and compose
# waits forever on `condition: service_healthy`. This runs them instead, every INTERVAL
# seconds, for the running containers of one compose project, until stopped.
#   deploy/podman/healthchecks.sh PROJECT [INTERVAL]
set -uo pipefail
project="${1:?usage: healthchecks.sh PROJECT [INTERVAL]}"
interval="${2:-5}"
while true; do
  for id in $(podman ps -q --filter "label=com.docker.compose.project=$project" \
      --filter health=starting --filter health=healthy --filter health=unhealthy); do
    podman healthcheck run "$id" >/dev/null 2>&1 || true  # the status is recorded on the container
  done
  sleep "$interval"
done
