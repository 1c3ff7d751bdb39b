package fedsched

import (
	"math"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

const mib = 1024 * 1024

// makePod is a one-container pod; cpu in milli-cores, mem in MiB (0: no request), gpus whole GPUs.
func makePod(name string, cpu, mem, gpus int64, ann map[string]string) *v1.Pod {
	req := v1.ResourceList{}
	if cpu > 0 {
		req[v1.ResourceCPU] = *resource.NewMilliQuantity(cpu, resource.DecimalSI)
	}
	if mem > 0 {
		req[v1.ResourceMemory] = *resource.NewQuantity(mem*mib, resource.BinarySI)
	}
	lim := v1.ResourceList{}
	if gpus > 0 {
		req[GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
		lim[GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: ann},
		Spec: v1.PodSpec{SchedulerName: "fedsched", Containers: []v1.Container{{
			Name: "main", Resources: v1.ResourceRequirements{Requests: req, Limits: lim},
		}}},
	}
}

// makeNode is a NodeInfo with allocatable cpu (milli), mem (MiB), gpus and the pods on it.
func makeNode(name string, cpu, mem, gpus int64, pods ...*v1.Pod) fwk.NodeInfo {
	alloc := v1.ResourceList{
		v1.ResourceCPU:    *resource.NewMilliQuantity(cpu, resource.DecimalSI),
		v1.ResourceMemory: *resource.NewQuantity(mem*mib, resource.BinarySI),
		v1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	if gpus > 0 {
		alloc[GPUResource] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	ni := framework.NewNodeInfo(pods...)
	ni.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.NodeStatus{Allocatable: alloc, Capacity: alloc}})
	return ni
}

func TestRequestOf(t *testing.T) {
	withInit := makePod("init", 500, 256, 0, nil)
	withInit.Spec.InitContainers = []v1.Container{{Name: "init", Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
		v1.ResourceCPU: resource.MustParse("2"), v1.ResourceMemory: resource.MustParse("64Mi"),
	}}}}
	withInit.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
	tests := []struct {
		name string
		pod  *v1.Pod
		want podRequest
	}{
		{"no requests: kube's non-zero defaults", makePod("be", 0, 0, 0, nil),
			podRequest{0, 0, 100, 200 * mib, 0}},
		{"cpu and memory", makePod("p", 1500, 1024, 0, nil),
			podRequest{1500, 1024 * mib, 1500, 1024 * mib, 0}},
		{"init container and overhead", withInit,
			podRequest{2100, 256 * mib, 2100, 256 * mib, 0}},
		{"two whole GPUs", makePod("g", 1000, 1024, 2, nil),
			podRequest{1000, 1024 * mib, 1000, 1024 * mib, 2000}},
		{"shared GPU", makePod("s", 1000, 1024, 0, map[string]string{GPUMilliAnnotation: "250"}),
			podRequest{1000, 1024 * mib, 1000, 1024 * mib, 250}},
		{"share annotations win over nvidia.com/gpu", makePod("s2", 1000, 1024, 1,
			map[string]string{GPUMilliAnnotation: "1000", GPUCountAnnotation: "3"}),
			podRequest{1000, 1024 * mib, 1000, 1024 * mib, 3000}},
		{"malformed share: the whole-GPU request", makePod("bad", 1000, 1024, 1,
			map[string]string{GPUMilliAnnotation: "500", GPUCountAnnotation: "2"}),
			podRequest{1000, 1024 * mib, 1000, 1024 * mib, 1000}},
		{"share out of range", makePod("bad2", 1000, 1024, 0, map[string]string{GPUMilliAnnotation: "1500"}),
			podRequest{1000, 1024 * mib, 1000, 1024 * mib, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := requestOf(tt.pod); got != tt.want {
				t.Errorf("requestOf() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestLeastAllocatedScore(t *testing.T) {
	tests := []struct {
		name string
		node fwk.NodeInfo
		pod  *v1.Pod
		want int64
	}{
		// (4000-1000)*100/4000 = 75, (8192-2048)*100/8192 = 75
		{"empty node", makeNode("n", 4000, 8192, 0), makePod("p", 1000, 2048, 0, nil), 75},
		// cpu (4000-3000)*100/4000 = 25, mem (8192-4096)*100/8192 = 50 -> 37 (integer)
		{"half used", makeNode("n", 4000, 8192, 0, makePod("a", 2000, 2048, 0, nil)), makePod("p", 1000, 2048, 0, nil), 37},
		// a pod without requests counts 100m / 200 MiB: (4000-100)*100/4000 = 97, (8192-200)*100/8192 = 97
		{"non-zero defaults", makeNode("n", 4000, 8192, 0), makePod("p", 0, 0, 0, nil), 97},
		{"cpu over capacity gives 0 for cpu", makeNode("n", 1000, 8192, 0), makePod("p", 2000, 4096, 0, nil), 25},
		{"no allocatable", makeNode("n", 0, 0, 0), makePod("p", 100, 100, 0, nil), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := leastAllocatedScore(tt.node, requestOf(tt.pod)); got != tt.want {
				t.Errorf("leastAllocatedScore() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestParseWeights(t *testing.T) {
	tests := []struct {
		name        string
		in          map[string]float64
		wantFree    [nResources]float64
		wantLoad    [nResources]float64
		wantUnknown string
		wantErr     string
	}{
		{name: "kube default", in: map[string]float64{"free_cpu": 0.5, "free_mem": 0.5, "load_gpu": 0},
			wantFree: [nResources]float64{0.5, 0.5}},
		{name: "rescaled to sum 1", in: map[string]float64{"free_cpu": 1, "load_gpu": 3},
			wantFree: [nResources]float64{0.25}, wantLoad: [nResources]float64{0, 0, 0, 0, 0.75}},
		{name: "unknown terms ignored", in: map[string]float64{"free_cpu": 1, "frag_removed": 5, "affinity": 1},
			wantFree: [nResources]float64{1}, wantUnknown: "affinity,frag_removed"},
		{name: "NaN", in: map[string]float64{"free_cpu": math.NaN()}, wantErr: "finite"},
		{name: "infinite", in: map[string]float64{"free_cpu": math.Inf(1)}, wantErr: "finite"},
		{name: "negative", in: map[string]float64{"free_cpu": 1.5, "load_cpu": -0.5}, wantErr: ">= 0"},
		{name: "all zero", in: map[string]float64{"free_cpu": 0}, wantErr: "sum to 0"},
		{name: "empty", in: nil, wantErr: "sum to 0"},
		{name: "only unknown", in: map[string]float64{"x": 1}, wantErr: "sum to 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, unknown, err := parseWeights(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseWeights() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w.free != tt.wantFree || w.load != tt.wantLoad {
				t.Errorf("parseWeights() = %+v, want free %v load %v", w, tt.wantFree, tt.wantLoad)
			}
			if got := strings.Join(unknown, ","); got != tt.wantUnknown {
				t.Errorf("unknown terms %q, want %q", got, tt.wantUnknown)
			}
		})
	}
}

func TestFreeSharesAndWeightedScore(t *testing.T) {
	gpuNode := makeNode("g", 8000, 16384, 4,
		makePod("whole", 1000, 1024, 1, nil),
		makePod("share", 1000, 1024, 0, map[string]string{GPUMilliAnnotation: "500"}))
	tests := []struct {
		name    string
		node    fwk.NodeInfo
		pod     *v1.Pod
		weights map[string]float64
		want    [nResources]float64
		score   int64
	}{
		{"cpu node, kube default weights", makeNode("c", 4000, 8192, 0, makePod("a", 1000, 2048, 0, nil)),
			makePod("p", 1000, 2048, 0, nil), map[string]float64{"free_cpu": 0.5, "free_mem": 0.5},
			[nResources]float64{0.5, 0.5, 1, 1, 0}, 50},
		// gpu: cap 4000, used 1000 (whole) + 500 (share), pod 1000: (4000-2500)/4000 = 0.375
		{"gpu node, pack GPUs", gpuNode, makePod("p", 2000, 4096, 1, nil), map[string]float64{"load_gpu": 1},
			[nResources]float64{0.5, 0.625, 1, 1, 0.375}, 63},
		{"over-committed node clips at 0", makeNode("c", 1000, 1024, 0), makePod("p", 3000, 512, 0, nil),
			map[string]float64{"free_cpu": 0.5, "load_mem": 0.5}, [nResources]float64{0, 0.5, 1, 1, 0}, 25},
		{"io and net terms are always free", makeNode("c", 1000, 1024, 0), makePod("p", 0, 0, 0, nil),
			map[string]float64{"free_io": 0.5, "load_net": 0.5}, [nResources]float64{1, 1, 1, 1, 0}, 50},
		{"no GPUs: the gpu term is 0 free", makeNode("c", 1000, 1024, 0), makePod("p", 0, 0, 0, nil),
			map[string]float64{"load_gpu": 1}, [nResources]float64{1, 1, 1, 1, 0}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := freeShares(tt.node, requestOf(tt.pod))
			for k := range x {
				if math.Abs(x[k]-tt.want[k]) > 1e-9 {
					t.Fatalf("freeShares() = %v, want %v", x, tt.want)
				}
			}
			w, _, err := parseWeights(tt.weights)
			if err != nil {
				t.Fatal(err)
			}
			if got := weightedScore(w, x); got != tt.score {
				t.Errorf("weightedScore() = %d, want %d", got, tt.score)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	list := func(s ...int64) fwk.NodeScoreList {
		l := make(fwk.NodeScoreList, len(s))
		for i, v := range s {
			l[i] = fwk.NodeScore{Name: string(rune('a' + i)), Score: v}
		}
		return l
	}
	tests := []struct {
		name    string
		in      fwk.NodeScoreList
		stretch bool
		want    fwk.NodeScoreList
	}{
		{"clamp only", list(-5, 0, 50, 100, 130), false, list(0, 0, 50, 100, 100)},
		{"min-max", list(40, 50, 60), true, list(0, 50, 100)},
		{"min-max rounds", list(10, 20, 40), true, list(0, 33, 100)},
		{"min-max, all equal: unchanged", list(42, 42), true, list(42, 42)},
		{"min-max, one node: unchanged", list(7), true, list(7)},
		{"min-max out of range input", list(-100, 300), true, list(0, 100)},
		{"empty", list(), true, list()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			normalize(tt.in, tt.stretch)
			for i := range tt.want {
				if tt.in[i] != tt.want[i] {
					t.Fatalf("normalize() = %v, want %v", tt.in, tt.want)
				}
			}
		})
	}
}
