package deploy_test

import (
	"encoding/json"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// The custom resources of deploy/autoscaling, whose CRDs this test has no
// API server for: KEDA's ScaledObject and the Prometheus Operator's
// PodMonitor. Each is a copy of the upstream Go type's JSON shape, and
// registering them in client-go's scheme makes the strict decoding of
// manifests_test.go (every YAML file, every rendered object) apply to
// them as to built-in kinds: a field the type does not have is an error.
//
// ScaledObject: github.com/kedacore/keda/v2 apis/keda/v1alpha1
// (scaledobject_types.go, scaletriggers_types.go), v2.20, spec complete.
// PodMonitor: github.com/prometheus-operator/prometheus-operator
// pkg/apis/monitoring/v1 (podmonitor_types.go, RelabelConfig of
// prometheus_types.go), the fields a scrape of tether needs; a manifest
// using another upstream field needs it added here first.

var (
	kedaGV       = schema.GroupVersion{Group: "keda.sh", Version: "v1alpha1"}
	monitoringGV = schema.GroupVersion{Group: "monitoring.coreos.com", Version: "v1"}
)

func init() {
	scheme.Scheme.AddKnownTypes(kedaGV, &ScaledObject{})
	scheme.Scheme.AddKnownTypes(monitoringGV, &PodMonitor{})
}

// ScaledObject is keda.sh/v1alpha1 ScaledObject.
type ScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ScaledObjectSpec `json:"spec"`
}

// ScaledObjectSpec is KEDA's, field for field.
type ScaledObjectSpec struct {
	ScaleTargetRef        *ScaleTarget    `json:"scaleTargetRef"`
	PollingInterval       *int32          `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32          `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32          `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32          `json:"maxReplicaCount,omitempty"`
	Advanced              *AdvancedConfig `json:"advanced,omitempty"`
	Triggers              []ScaleTriggers `json:"triggers"`
	Fallback              *Fallback       `json:"fallback,omitempty"`
}

type ScaleTarget struct {
	Name                   string `json:"name"`
	APIVersion             string `json:"apiVersion,omitempty"`
	Kind                   string `json:"kind,omitempty"`
	EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
}

type AdvancedConfig struct {
	HorizontalPodAutoscalerConfig *HorizontalPodAutoscalerConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	RestoreToOriginalReplicaCount bool                           `json:"restoreToOriginalReplicaCount,omitempty"`
	ScalingModifiers              *ScalingModifiers              `json:"scalingModifiers,omitempty"`
}

type HorizontalPodAutoscalerConfig struct {
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
	Name     string                                         `json:"name,omitempty"`
}

type ScalingModifiers struct {
	Formula          string                         `json:"formula,omitempty"`
	Target           string                         `json:"target,omitempty"`
	ActivationTarget string                         `json:"activationTarget,omitempty"`
	MetricType       autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type ScaleTriggers struct {
	Type              string                         `json:"type"`
	Name              string                         `json:"name,omitempty"`
	UseCachedMetrics  bool                           `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string              `json:"metadata"`
	AuthenticationRef *AuthenticationRef             `json:"authenticationRef,omitempty"`
	MetricType        autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

type AuthenticationRef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

type Fallback struct {
	FailureThreshold int32  `json:"failureThreshold"`
	Replicas         int32  `json:"replicas"`
	Behavior         string `json:"behavior,omitempty"`
}

func (o *ScaledObject) DeepCopyObject() runtime.Object { return deepCopy(o) }

// PodMonitor is monitoring.coreos.com/v1 PodMonitor (a subset of its
// spec).
type PodMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PodMonitorSpec `json:"spec"`
}

type PodMonitorSpec struct {
	JobLabel            string               `json:"jobLabel,omitempty"`
	PodTargetLabels     []string             `json:"podTargetLabels,omitempty"`
	PodMetricsEndpoints []PodMetricsEndpoint `json:"podMetricsEndpoints"`
	Selector            metav1.LabelSelector `json:"selector"`
	NamespaceSelector   NamespaceSelector    `json:"namespaceSelector,omitempty"`
}

type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type PodMetricsEndpoint struct {
	Port                 *string         `json:"port,omitempty"`
	PortNumber           *int32          `json:"portNumber,omitempty"`
	Path                 string          `json:"path,omitempty"`
	Scheme               string          `json:"scheme,omitempty"`
	Interval             string          `json:"interval,omitempty"`
	ScrapeTimeout        string          `json:"scrapeTimeout,omitempty"`
	HonorLabels          bool            `json:"honorLabels,omitempty"`
	MetricRelabelConfigs []RelabelConfig `json:"metricRelabelings,omitempty"`
	RelabelConfigs       []RelabelConfig `json:"relabelings,omitempty"`
}

type RelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      int64    `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

func (o *PodMonitor) DeepCopyObject() runtime.Object { return deepCopy(o) }

// deepCopy copies through JSON: these types exist for decoding, where
// speed does not matter.
func deepCopy[T any](o *T) *T {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	c := new(T)
	if err := json.Unmarshal(b, c); err != nil {
		panic(err)
	}
	return c
}

// adapterConfig is prometheus-adapter's configuration file
// (sigs.k8s.io/prometheus-adapter pkg/config: MetricsDiscoveryConfig),
// which the adapter reads with gopkg.in/yaml.v2's UnmarshalStrict: the
// yaml tags are the adapter's.
type adapterConfig struct {
	Rules         []adapterRule `yaml:"rules"`
	ResourceRules *struct {
		CPU    adapterResourceRule `yaml:"cpu"`
		Memory adapterResourceRule `yaml:"memory"`
		Window string              `yaml:"window"`
	} `yaml:"resourceRules,omitempty"`
	ExternalRules []adapterRule `yaml:"externalRules,omitempty"`
}

type adapterRule struct {
	SeriesQuery   string `yaml:"seriesQuery"`
	SeriesFilters []struct {
		Is    string `yaml:"is,omitempty"`
		IsNot string `yaml:"isNot,omitempty"`
	} `yaml:"seriesFilters"`
	Resources    adapterResources `yaml:"resources"`
	Name         adapterName      `yaml:"name"`
	MetricsQuery string           `yaml:"metricsQuery,omitempty"`
}

type adapterResources struct {
	Template  string `yaml:"template,omitempty"`
	Overrides map[string]struct {
		Group    string `yaml:"group,omitempty"`
		Resource string `yaml:"resource"`
	} `yaml:"overrides,omitempty"`
	Namespaced *bool `yaml:"namespaced,omitempty"`
}

type adapterName struct {
	Matches string `yaml:"matches"`
	As      string `yaml:"as"`
}

type adapterResourceRule struct {
	ContainerQuery string           `yaml:"containerQuery"`
	NodeQuery      string           `yaml:"nodeQuery"`
	Resources      adapterResources `yaml:"resources"`
	ContainerLabel string           `yaml:"containerLabel"`
}
