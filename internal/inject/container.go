package inject

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	yaml2 "go.yaml.in/yaml/v2"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// nonrootUID is distroless' "nonroot" user, which the image runs as.
const nonrootUID = 65532

// Container returns the tether container for c (which must be valid).
func (c Config) Container() corev1.Container {
	args := []string{
		"serve",
		"--listen=" + ListenAddr,
		fmt.Sprintf("--admin-listen=:%d", AdminPort),
		"--k8s-service=" + c.serviceArg(),
	}
	if c.Port != "" {
		args = append(args, "--k8s-port="+c.Port)
	}
	if c.Balancer != "" {
		args = append(args, "--balancer="+c.Balancer)
	}
	if c.SessionTTL != "" {
		args = append(args, "--session-ttl="+c.SessionTTL)
	}
	args = append(args, "--shutdown-grace="+formatDuration(c.ShutdownGrace), "--log-format=json")
	if c.LogLevel != "" {
		args = append(args, "--log-level="+c.LogLevel)
	}

	env := []corev1.EnvVar{{
		Name:      namespaceEnv,
		ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}},
	}}
	if c.RedisURLSecret != "" {
		name, key := c.redisSecret()
		env = append(env, corev1.EnvVar{
			Name: "TETHER_REDIS_URL",
			ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: name},
				Key:                  key,
			}},
		})
	}

	if c.CPULimit != "" {
		// The runtime would read the limit itself, but round it up to 2
		// at least (gomaxprocsFor).
		env = append(env, corev1.EnvVar{Name: "GOMAXPROCS", Value: strconv.FormatInt(gomaxprocsFor(c.CPULimit), 10)})
	}

	requests := corev1.ResourceList{}
	if c.CPURequest != "" {
		requests[corev1.ResourceCPU] = resource.MustParse(c.CPURequest)
	}
	if c.MemoryRequest != "" {
		requests[corev1.ResourceMemory] = resource.MustParse(c.MemoryRequest)
	}

	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path,
				Port: intstr.FromString(adminPortName),
			}},
			PeriodSeconds:    period,
			FailureThreshold: failures,
		}
	}
	ctr := corev1.Container{
		Name:  ContainerName,
		Image: c.Image,
		Args:  args,
		Ports: []corev1.ContainerPort{{Name: adminPortName, ContainerPort: AdminPort}},
		Env:   env,
		// /healthz: the process is up. /readyz: endpoints are known and it
		// is not draining; the pod is not Ready (the proxy gets no traffic)
		// until tether can route.
		LivenessProbe:  probe("/healthz", 10, 3),
		ReadinessProbe: probe("/readyz", 5, 2),
		// A native sidecar's startup probe holds back the containers after
		// it: the proxy starts once tether listens.
		StartupProbe: probe("/healthz", 1, 30),
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: new(false),
			ReadOnlyRootFilesystem:   new(true),
			RunAsNonRoot:             new(true),
			RunAsUser:                new(int64(nonrootUID)),
			RunAsGroup:               new(int64(nonrootUID)),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	if len(requests) > 0 {
		ctr.Resources.Requests = requests
	}
	if c.CPULimit != "" {
		ctr.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(c.CPULimit)}
	}
	if c.Legacy {
		// A classic sidecar gets SIGTERM together with the proxy; the sleep
		// keeps tether serving while the proxy drains through it.
		if c.PreStopSleep > 0 {
			ctr.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{
				Sleep: &corev1.SleepAction{Seconds: int64((c.PreStopSleep + time.Second - 1) / time.Second)},
			}}
		}
	} else {
		// A native sidecar: started before the proxy, stopped after it.
		ctr.RestartPolicy = new(corev1.ContainerRestartPolicyAlways)
	}
	return ctr
}

// toNode turns any JSON-marshalable value into block-style YAML nodes, in
// the value's field order.
func toNode(v any) (*yaml.Node, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	n := doc.Content[0]
	blockStyle(n)
	return n, nil
}

// blockStyle drops flow and quoting styles (JSON's): block collections,
// and quotes only where a plain scalar would read as something else, to
// YAML 1.2 readers (the encoder sees to that) and to YAML 1.1 ones, such
// as kubectl's, which read yes, on, y or 0777 as booleans and numbers.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && !plainInYAML11(n.Value) {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// plainInYAML11 reports whether s, unquoted, reads back as the string s in
// YAML 1.1.
func plainInYAML11(s string) bool {
	var v any
	if err := yaml2.Unmarshal([]byte(s), &v); err != nil {
		return false
	}
	str, ok := v.(string)
	return ok && str == s
}
