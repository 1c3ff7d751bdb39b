package fedsched

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"sigs.k8s.io/yaml"
)

// Modes: which RPC of fedsched.decision.v1.DecisionService the plugin calls in PreScore.
const (
	// ModeScores calls ScoreNodes: the node-scoring policy's 0..100 score for every candidate.
	ModeScores = "scores"
	// ModeWeights calls GetSchedulingWeights: the TD3 weight policy's weights over the agent's
	// weight terms; the plugin scores each node with them (see weights.go).
	ModeWeights = "weights"
)

// Fallbacks: what Score returns for a pod whose RPC failed, timed out or answered nonsense.
const (
	// FallbackLeastAllocated scores a node as NodeResourcesFit's LeastAllocated strategy does
	// (CPU and memory, weight 1 each, non-zero requests); see fallback.go.
	FallbackLeastAllocated = "LeastAllocated"
	// FallbackNeutral gives every node 0: the plugin then has no say in the pod's placement.
	FallbackNeutral = "Neutral"
)

// Normalizations: what NormalizeScore does to the policy's scores (fallback scores are only
// clamped, as kube's own resource scores are).
const (
	// NormalizeNone keeps the policy's 0..100 scores as they are (clamped into 0..100).
	NormalizeNone = "None"
	// NormalizeMinMax stretches the policy's scores linearly so the best candidate gets 100 and
	// the worst 0 (all equal: unchanged).
	NormalizeMinMax = "MinMax"
)

const (
	// DefaultDeadline is the deadline of one RPC when the Args leave it out. The agent's own
	// budget defaults to 10 ms (`fedsched serve --budget-ms`); the rest is transport.
	DefaultDeadline = 50 * time.Millisecond
	// MaxDeadline bounds Deadline: the call runs inside the pod's scheduling cycle, which is
	// serial, so every millisecond here is a millisecond of every pod's latency.
	MaxDeadline = time.Second
)

// Args are the plugin's arguments, the `args` of its entry in a profile's pluginConfig:
//
//	pluginConfig:
//	- name: FedschedScore
//	  args:
//	    address: fedsched-agent.fedsched-system.svc:9443
//	    deadline: 50ms
//	    mode: scores
//	    tls: {caFile: /etc/fedsched/ca.crt, certFile: /etc/fedsched/tls.crt,
//	          keyFile: /etc/fedsched/tls.key, serverName: fedsched-agent}
//
// Unknown fields are an error (a misspelt field would otherwise be silently ignored).
type Args struct {
	// apiVersion/kind may be written (as for in-tree plugins' args); they are not checked.
	metav1.TypeMeta `json:",inline"`

	// Address of the agent's gRPC decision service (`fedsched serve --grpc-port`), host:port, or
	// any gRPC target (dns:///host:port, unix:///path). Required.
	Address string `json:"address"`
	// Deadline of one RPC, as a Go duration ("50ms"). Default 50ms; at most 1s.
	Deadline *metav1.Duration `json:"deadline,omitempty"`
	// Mode: "scores" (default; ScoreNodes, the node-scoring policy) or "weights"
	// (GetSchedulingWeights, the TD3 weight policy: start the agent with --weights-policy).
	Mode string `json:"mode,omitempty"`
	// TLS: the files of mutual TLS. Required unless Insecure.
	TLS *TLSArgs `json:"tls,omitempty"`
	// Insecure: plaintext gRPC (tests, a loopback agent). TLS must then be left out.
	Insecure bool `json:"insecure,omitempty"`
	// Fallback: "LeastAllocated" (default) or "Neutral".
	Fallback string `json:"fallback,omitempty"`
	// Normalization of the policy's scores: "None" (default) or "MinMax".
	Normalization string `json:"normalization,omitempty"`
	// SafetyFilter: refuse at Filter the nodes the agent's safety filter refuses (FilterNodes,
	// asked once per pod in PreFilter under Deadline: a node above the hard measured-CPU or
	// memory limit, cordoned or NotReady in the agent's cache, excluded, ...). Default true.
	// Fails open: without an answer in time every node passes this plugin's Filter.
	SafetyFilter *bool `json:"safetyFilter,omitempty"`
}

// TLSArgs are the PEM files of mutual TLS with the agent (e.g. from `fedsched certs`): the CA
// that signed the agent's server certificate, and the scheduler's client certificate and key,
// which the agent verifies against its --client-ca.
type TLSArgs struct {
	CAFile   string `json:"caFile"`
	CertFile string `json:"certFile"`
	KeyFile  string `json:"keyFile"`
	// ServerName checked against the agent's certificate; default: the host part of Address.
	ServerName string `json:"serverName,omitempty"`
}

// DecodeArgs turns the pluginConfig args kube-scheduler hands to the plugin's factory into
// defaulted, validated Args. Out-of-tree args arrive as *runtime.Unknown (JSON or YAML) and are
// decoded with frameworkruntime.DecodeInto, as kubernetes-sigs/scheduler-plugins do; then once
// more strictly, to reject unknown fields. A *Args is taken as it is (tests).
func DecodeArgs(obj runtime.Object) (*Args, error) {
	args := &Args{}
	switch a := obj.(type) {
	case nil:
	case *Args:
		if a != nil {
			args = a.DeepCopy()
		}
	default:
		if err := frameworkruntime.DecodeInto(obj, args); err != nil {
			return nil, fmt.Errorf("decoding %s args: %w", Name, err)
		}
		if u, ok := obj.(*runtime.Unknown); ok && len(bytes.TrimSpace(u.Raw)) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &Args{}); err != nil {
				return nil, fmt.Errorf("decoding %s args: %w", Name, err)
			}
		}
	}
	SetDefaults(args)
	if err := ValidateArgs(args); err != nil {
		return nil, err
	}
	return args, nil
}

// SetDefaults fills the fields the Args leave out (Deadline, Mode, Fallback, Normalization,
// SafetyFilter, TLS.ServerName).
func SetDefaults(a *Args) {
	if a.SafetyFilter == nil {
		on := true
		a.SafetyFilter = &on
	}
	if a.Deadline == nil {
		a.Deadline = &metav1.Duration{Duration: DefaultDeadline}
	}
	if a.Mode == "" {
		a.Mode = ModeScores
	}
	if a.Fallback == "" {
		a.Fallback = FallbackLeastAllocated
	}
	if a.Normalization == "" {
		a.Normalization = NormalizeNone
	}
	if a.TLS != nil && a.TLS.ServerName == "" {
		a.TLS.ServerName = hostOf(a.Address)
	}
}

// hostOf is the host part of a gRPC target ("dns:///h:p", "h:p", "[::1]:p"), or "" if none.
func hostOf(target string) string {
	t := target
	if i := strings.Index(t, ":///"); i >= 0 {
		t = t[i+4:]
	} else if i := strings.Index(t, "://"); i >= 0 {
		t = t[i+3:]
		if j := strings.Index(t, "/"); j >= 0 { // dns://authority/host:port
			t = t[j+1:]
		}
	}
	if strings.HasPrefix(target, "unix:") {
		return ""
	}
	if h, _, err := net.SplitHostPort(t); err == nil {
		return h
	}
	return t
}

// ValidateArgs checks defaulted Args; the error lists every field at fault.
func ValidateArgs(a *Args) error {
	var errs field.ErrorList
	if strings.TrimSpace(a.Address) == "" {
		errs = append(errs, field.Required(field.NewPath("address"), "the agent's gRPC address (host:port)"))
	}
	if d := a.Deadline; d == nil || d.Duration <= 0 || d.Duration > MaxDeadline {
		v := "<nil>"
		if d != nil {
			v = d.Duration.String()
		}
		errs = append(errs, field.Invalid(field.NewPath("deadline"), v,
			fmt.Sprintf("must be > 0 and at most %s", MaxDeadline)))
	}
	if a.Mode != ModeScores && a.Mode != ModeWeights {
		errs = append(errs, field.NotSupported(field.NewPath("mode"), a.Mode, []string{ModeScores, ModeWeights}))
	}
	if a.Fallback != FallbackLeastAllocated && a.Fallback != FallbackNeutral {
		errs = append(errs, field.NotSupported(field.NewPath("fallback"), a.Fallback,
			[]string{FallbackLeastAllocated, FallbackNeutral}))
	}
	if a.Normalization != NormalizeNone && a.Normalization != NormalizeMinMax {
		errs = append(errs, field.NotSupported(field.NewPath("normalization"), a.Normalization,
			[]string{NormalizeNone, NormalizeMinMax}))
	}
	tlsPath := field.NewPath("tls")
	switch {
	case a.Insecure && a.TLS != nil:
		errs = append(errs, field.Forbidden(tlsPath, "must be left out with insecure: true"))
	case !a.Insecure && a.TLS == nil:
		errs = append(errs, field.Required(tlsPath, "mutual TLS files (caFile, certFile, keyFile), or insecure: true"))
	case a.TLS != nil:
		for _, f := range []struct{ name, value string }{
			{"caFile", a.TLS.CAFile}, {"certFile", a.TLS.CertFile}, {"keyFile", a.TLS.KeyFile},
		} {
			if strings.TrimSpace(f.value) == "" {
				errs = append(errs, field.Required(tlsPath.Child(f.name), "a PEM file"))
			}
		}
		if a.TLS.ServerName == "" {
			errs = append(errs, field.Required(tlsPath.Child("serverName"), "no host in address to default it from"))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid %s args: %w", Name, errs.ToAggregate())
	}
	return nil
}

// safetyFilter is SafetyFilter, true when left out.
func (a *Args) safetyFilter() bool { return a.SafetyFilter == nil || *a.SafetyFilter }

// String is the Args as JSON (for logs).
func (a *Args) String() string {
	b, err := json.Marshal(a)
	if err != nil {
		return fmt.Sprintf("%+v", *a)
	}
	return string(b)
}

// DeepCopyInto copies the Args into out (hand-written; there is no code generator here).
func (a *Args) DeepCopyInto(out *Args) {
	*out = *a
	if a.Deadline != nil {
		d := *a.Deadline
		out.Deadline = &d
	}
	if a.TLS != nil {
		t := *a.TLS
		out.TLS = &t
	}
	if a.SafetyFilter != nil {
		f := *a.SafetyFilter
		out.SafetyFilter = &f
	}
}

// DeepCopy returns a copy of the Args.
func (a *Args) DeepCopy() *Args {
	if a == nil {
		return nil
	}
	out := &Args{}
	a.DeepCopyInto(out)
	return out
}

// DeepCopyObject makes *Args a runtime.Object, so a typed Args can be handed to New directly.
func (a *Args) DeepCopyObject() runtime.Object { return a.DeepCopy() }
