package kubetest

import "syscall"

// sysProcAttr puts a child in its own process group and kills it if the
// test process dies without cleaning up.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
