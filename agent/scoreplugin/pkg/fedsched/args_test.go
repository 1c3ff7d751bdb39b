package fedsched

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

func unknown(raw, contentType string) *runtime.Unknown {
	return &runtime.Unknown{Raw: []byte(raw), ContentType: contentType}
}

func TestDecodeArgs(t *testing.T) {
	on, off := new(bool), new(bool)
	*on = true
	tls := func(server string) *TLSArgs {
		return &TLSArgs{CAFile: "/ca.crt", CertFile: "/tls.crt", KeyFile: "/tls.key", ServerName: server}
	}
	tests := []struct {
		name    string
		obj     runtime.Object
		want    *Args
		wantErr []string // substrings of the error, every one
	}{{
		name: "JSON with defaults",
		obj:  unknown(`{"address":"agent.fedsched:9443","tls":{"caFile":"/ca.crt","certFile":"/tls.crt","keyFile":"/tls.key"}}`, runtime.ContentTypeJSON),
		want: &Args{Address: "agent.fedsched:9443", Deadline: &metav1.Duration{Duration: 50 * time.Millisecond},
			Mode: ModeScores, TLS: tls("agent.fedsched"), Fallback: FallbackLeastAllocated, Normalization: NormalizeNone, SafetyFilter: on},
	}, {
		name: "YAML, every field",
		obj: unknown(`
apiVersion: fedsched.dev/v1
kind: FedschedScoreArgs
address: dns:///agent:9443
deadline: 20ms
mode: weights
fallback: Neutral
normalization: MinMax
safetyFilter: false
tls: {caFile: /ca.crt, certFile: /tls.crt, keyFile: /tls.key, serverName: fedsched-agent}
`, runtime.ContentTypeYAML),
		want: &Args{TypeMeta: metav1.TypeMeta{APIVersion: "fedsched.dev/v1", Kind: "FedschedScoreArgs"},
			Address: "dns:///agent:9443", Deadline: &metav1.Duration{Duration: 20 * time.Millisecond},
			Mode: ModeWeights, TLS: tls("fedsched-agent"), Fallback: FallbackNeutral, Normalization: NormalizeMinMax, SafetyFilter: off},
	}, {
		name: "empty content type is JSON; insecure",
		obj:  unknown(`{"address":"127.0.0.1:50051","insecure":true}`, ""),
		want: &Args{Address: "127.0.0.1:50051", Deadline: &metav1.Duration{Duration: DefaultDeadline}, Mode: ModeScores,
			Insecure: true, Fallback: FallbackLeastAllocated, Normalization: NormalizeNone, SafetyFilter: on},
	}, {
		name: "typed args",
		obj:  &Args{Address: "[::1]:7000", TLS: &TLSArgs{CAFile: "a", CertFile: "b", KeyFile: "c"}},
		want: &Args{Address: "[::1]:7000", Deadline: &metav1.Duration{Duration: DefaultDeadline}, Mode: ModeScores,
			TLS: &TLSArgs{CAFile: "a", CertFile: "b", KeyFile: "c", ServerName: "::1"}, Fallback: FallbackLeastAllocated,
			Normalization: NormalizeNone, SafetyFilter: on},
	}, {
		name:    "no args at all",
		obj:     nil,
		wantErr: []string{"address: Required", "tls: Required"},
	}, {
		name:    "unknown field",
		obj:     unknown(`{"address":"a:1","insecure":true,"deadlne":"10ms"}`, runtime.ContentTypeJSON),
		wantErr: []string{`unknown field "deadlne"`},
	}, {
		name:    "bad deadline syntax",
		obj:     unknown(`{"address":"a:1","insecure":true,"deadline":"fast"}`, runtime.ContentTypeJSON),
		wantErr: []string{"decoding FedschedScore args"},
	}, {
		name:    "zero deadline",
		obj:     unknown(`{"address":"a:1","insecure":true,"deadline":"0s"}`, runtime.ContentTypeJSON),
		wantErr: []string{"deadline: Invalid value: \"0s\""},
	}, {
		name:    "deadline too long",
		obj:     unknown(`{"address":"a:1","insecure":true,"deadline":"2s"}`, runtime.ContentTypeJSON),
		wantErr: []string{"at most 1s"},
	}, {
		name:    "bad mode, fallback, normalization",
		obj:     unknown(`{"address":"a:1","insecure":true,"mode":"Weights","fallback":"MostAllocated","normalization":"Softmax"}`, ""),
		wantErr: []string{`mode: Unsupported value: "Weights"`, `fallback: Unsupported value: "MostAllocated"`, `normalization: Unsupported value: "Softmax"`},
	}, {
		name:    "insecure with TLS",
		obj:     unknown(`{"address":"a:1","insecure":true,"tls":{"caFile":"x","certFile":"y","keyFile":"z"}}`, ""),
		wantErr: []string{"tls: Forbidden"},
	}, {
		name:    "TLS files missing",
		obj:     unknown(`{"address":"a:1","tls":{"caFile":"/ca.crt"}}`, ""),
		wantErr: []string{"tls.certFile: Required", "tls.keyFile: Required"},
	}, {
		name:    "no server name to default from",
		obj:     unknown(`{"address":"unix:///run/fedsched.sock","tls":{"caFile":"a","certFile":"b","keyFile":"c"}}`, ""),
		wantErr: []string{"tls.serverName: Required"},
	}, {
		name:    "safetyFilter not a boolean",
		obj:     unknown(`{"address":"a:1","insecure":true,"safetyFilter":"yes"}`, ""),
		wantErr: []string{"decoding FedschedScore args"},
	}, {
		name:    "unsupported content type",
		obj:     unknown(`{}`, "application/vnd.kubernetes.protobuf"),
		wantErr: []string{"not supported content type"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeArgs(tt.obj)
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("DecodeArgs() = %v, want an error", got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeArgs(): %v", err)
			}
			if got.String() != tt.want.String() {
				t.Errorf("DecodeArgs() =\n %s\nwant\n %s", got, tt.want)
			}
		})
	}
}

func TestDecodeArgsDoesNotChangeTypedArgs(t *testing.T) {
	in := &Args{Address: "a:1", Insecure: true}
	if _, err := DecodeArgs(in); err != nil {
		t.Fatal(err)
	}
	if in.Deadline != nil || in.Mode != "" {
		t.Errorf("DecodeArgs defaulted the caller's Args: %s", in)
	}
}

func TestHostOf(t *testing.T) {
	for _, tt := range []struct{ target, want string }{
		{"agent:9443", "agent"},
		{"10.0.0.7:9443", "10.0.0.7"},
		{"[::1]:9443", "::1"},
		{"dns:///agent.fedsched.svc:9443", "agent.fedsched.svc"},
		{"dns://8.8.8.8/agent:9443", "agent"},
		{"passthrough:///agent:1", "agent"},
		{"agent", "agent"},
		{"unix:///run/agent.sock", ""},
		{"unix:relative.sock", ""},
	} {
		if got := hostOf(tt.target); got != tt.want {
			t.Errorf("hostOf(%q) = %q, want %q", tt.target, got, tt.want)
		}
	}
}

// The README's example, loaded as kube-scheduler loads --config: the plugin's args reach New
// as a runtime.Unknown that DecodeArgs accepts.
func TestExampleConfig(t *testing.T) {
	cfg, err := options.LoadConfigFromFile(klog.Background(), "../../examples/scheduler-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var found *Args
	for _, p := range cfg.Profiles {
		for _, pc := range p.PluginConfig {
			if pc.Name != Name {
				continue
			}
			if _, ok := pc.Args.(*runtime.Unknown); !ok {
				t.Fatalf("args of %s arrive as %T, want *runtime.Unknown", Name, pc.Args)
			}
			if found, err = DecodeArgs(pc.Args); err != nil {
				t.Fatal(err)
			}
		}
		if p.SchedulerName == "fedsched" {
			ok := false
			for _, e := range p.Plugins.MultiPoint.Enabled {
				ok = ok || (e.Name == Name && e.Weight == 5)
			}
			if !ok {
				t.Errorf("profile fedsched does not enable %s with weight 5: %+v", Name, p.Plugins.MultiPoint)
			}
		}
	}
	if found == nil {
		t.Fatalf("no pluginConfig for %s", Name)
	}
	if found.Mode != ModeScores || found.Deadline.Duration != 50*time.Millisecond || !found.safetyFilter() ||
		found.TLS == nil || found.TLS.ServerName != "fedsched-agent.fedsched-system.svc" {
		t.Errorf("example args decoded as %s", found)
	}
}
