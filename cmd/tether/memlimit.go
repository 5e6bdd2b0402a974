package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of the container's memory limit given to the
// Go runtime as its soft limit (GOMEMLIMIT): the rest is for what the
// runtime does not count, chiefly the binary's own pages.
const memoryLimitShare = 0.9

// setMemoryLimit gives the Go runtime a soft memory limit of
// memoryLimitShare of the cgroup's (the container's) memory limit, unless
// GOMEMLIMIT is set (the runtime has applied it; "off" turns the limit off)
// or there is no cgroup limit. Near the limit the collector runs more often
// instead of letting the heap grow into an OOM kill. root is the file
// system root ("/"; tests pass a directory of fake cgroup files).
func setMemoryLimit(log *slog.Logger, getenv func(string) string, root string) {
	if v := getenv("GOMEMLIMIT"); v != "" {
		log.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
		return
	}
	limit, file, err := cgroupMemoryLimit(root)
	switch {
	case err != nil:
		log.Warn("no memory limit: cannot read the cgroup's", "err", err)
		return
	case limit == 0:
		log.Debug("no memory limit: the cgroup has none")
		return
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	log.Info("memory limit from the cgroup's", "GOMEMLIMIT", soft, "cgroup_limit", limit, "file", file)
}

// cgroupMemoryLimit returns the memory limit of this process's cgroup in
// bytes, the smallest one set on its path (0: none), and the file it came
// from. cgroup v2: memory.max from the process's cgroup up to the root of
// the mount (in a container with its own cgroup namespace, the container's
// cgroup is that root). cgroup v1: the memory controller's
// memory.limit_in_bytes, where a huge value means none. A process outside
// any cgroup hierarchy (no /proc/self/cgroup) has no limit.
func cgroupMemoryLimit(root string) (limit int64, file string, err error) {
	b, err := os.ReadFile(filepath.Join(root, "proc/self/cgroup"))
	if os.IsNotExist(err) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", err
	}
	var v1, v2 string
	var hasV1, hasV2 bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2, hasV2 = parts[2], true
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1, hasV1 = parts[2], true
			}
		}
	}
	// A hybrid host lists both: the memory controller is v1's there.
	switch {
	case hasV1:
		return cgroupV1Limit(root, v1)
	case hasV2:
		return cgroupV2Limit(root, v2)
	}
	return 0, "", nil
}

func cgroupV2Limit(root, cgroup string) (limit int64, file string, err error) {
	mount := filepath.Join(root, "sys/fs/cgroup")
	// Inside a cgroup namespace the path is "/" and the mount is the
	// process's own cgroup; outside, the path is below the mount.
	for dir := path.Clean("/" + cgroup); ; dir = path.Dir(dir) {
		f := filepath.Join(mount, filepath.FromSlash(dir), "memory.max")
		b, err := os.ReadFile(f)
		switch {
		case os.IsNotExist(err):
			// The root cgroup has no memory.max; a path outside the
			// mount (another namespace's) has nothing to read.
		case err != nil:
			return 0, "", err
		default:
			s := strings.TrimSpace(string(b))
			if s != "max" {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return 0, "", fmt.Errorf("%s: %q is not a number of bytes", f, s)
				}
				if limit == 0 || n < limit {
					limit, file = n, f
				}
			}
		}
		if dir == "/" {
			return limit, file, nil
		}
	}
}

// noV1Limit: cgroup v1 says "no limit" with the largest page-aligned int64
// (9223372036854771712); anything from 2^62 up is taken as none.
const noV1Limit = math.MaxInt64 / 2

func cgroupV1Limit(root, cgroup string) (limit int64, file string, err error) {
	mount := filepath.Join(root, "sys/fs/cgroup/memory")
	// Without a cgroup namespace the path is the host's; a container
	// mounts its own cgroup at the controller's root.
	for _, dir := range []string{filepath.Join(mount, filepath.FromSlash(path.Clean("/"+cgroup))), mount} {
		f := filepath.Join(dir, "memory.limit_in_bytes")
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return 0, "", err
		}
		s := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, "", fmt.Errorf("%s: %q is not a number of bytes", f, s)
		}
		if n >= noV1Limit {
			return 0, "", nil
		}
		return n, f, nil
	}
	return 0, "", nil
}
