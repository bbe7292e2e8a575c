package adapter

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestParseMetricsGolden reads each engine's exposition (testdata/SOURCES.md
// says where each file comes from) under its own flavor and under "auto".
func TestParseMetricsGolden(t *testing.T) {
	tests := []struct {
		file   string
		flavor string
		want   LoadSample
	}{
		{"vllm/metrics-under-load.txt", FlavorVLLM, LoadSample{
			KVUsage: 0.00146484375, KVKnown: true, Running: 6, Waiting: 0,
			// Six series share the newest timestamp 1.795985578e+09. Nothing
			// waits (num_requests_waiting 0), so the three that name waiting
			// adapters are not the present state; the others' union is.
			LoraRunning: []string{"lora-a", "lora-b"}, LoraWaiting: []string{}, MaxLora: 2,
			KVBlocks: 2048, BlockSize: 16, // cache_config_info
			PrefixQueries: 252, PrefixHits: 144, PrefixKnown: true,
			TTFTSeconds: 0.16800000000000004, TTFTCount: 12, TTFTKnown: true, // time_to_first_token_seconds
		}},
		{"vllm/metrics-idle-tied.txt", FlavorVLLM, LoadSample{
			KVUsage: 0, KVKnown: true, Running: 0, Waiting: 0,
			// Three series tie on the newest timestamp, two naming running
			// adapters; the engine runs nothing, so no adapter runs.
			LoraRunning: []string{}, LoraWaiting: []string{}, MaxLora: 2,
			KVBlocks: 2048, BlockSize: 16,
			PrefixQueries: 252, PrefixHits: 144, PrefixKnown: true,
			TTFTSeconds: 0.16800000000000004, TTFTCount: 12, TTFTKnown: true, // time_to_first_token_seconds
		}},
		{"vllm/metrics-idle.txt", FlavorVLLM, LoadSample{
			KVUsage: 0, KVKnown: true, Running: 0, Waiting: 0,
			// The newest series (1.79598558e+09) has empty adapter lists.
			LoraRunning: []string{}, LoraWaiting: []string{}, MaxLora: 2,
			KVBlocks: 2048, BlockSize: 16,
			PrefixQueries: 252, PrefixHits: 144, PrefixKnown: true,
			TTFTSeconds: 0.16800000000000004, TTFTCount: 12, TTFTKnown: true, // time_to_first_token_seconds
		}},
		{"sglang/metrics-from-source.txt", FlavorSGLang, LoadSample{
			KVUsage: 0.3699415312370517, KVKnown: true, Running: 12, Waiting: 3,
			LoraRunning: []string{}, LoraWaiting: []string{}, MaxLora: 8,
			TTFTSeconds: 936.8799907290745, TTFTCount: 2398, TTFTKnown: true,
		}},
		{"sglang/metrics-docs-sample.txt", FlavorSGLang, LoadSample{
			KVUsage: 0.28, KVKnown: true, Running: 162, Waiting: 2826,
			LoraRunning: []string{}, LoraWaiting: []string{},
			TTFTSeconds: 2.3518979474117756e+06, TTFTCount: 11008, TTFTKnown: true,
		}},
		{"llamacpp/metrics-from-source.txt", FlavorLlamaCpp, LoadSample{
			Running: 3, Waiting: 2, LoraRunning: []string{}, LoraWaiting: []string{},
		}},
		{"llamacpp/metrics-from-source-idle.txt", FlavorLlamaCpp, LoadSample{
			LoraRunning: []string{}, LoraWaiting: []string{},
		}},
		{"tgi/metrics-from-source.txt", FlavorTGI, LoadSample{
			Running: 21, Waiting: 4, LoraRunning: []string{}, LoraWaiting: []string{},
		}},
	}
	for _, tt := range tests {
		for _, flavor := range []string{tt.flavor, FlavorAuto} {
			t.Run(tt.file+"/"+flavor, func(t *testing.T) {
				f, err := os.Open(filepath.Join("testdata", tt.file))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				got, as, err := ParseMetrics(flavor, f)
				if err != nil {
					t.Fatalf("ParseMetrics: %v", err)
				}
				if as != tt.flavor {
					t.Errorf("read as %q, want %q", as, tt.flavor)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("sample\n got %+v\nwant %+v", got, tt.want)
				}
			})
		}
	}
}

func TestParseMetricsRules(t *testing.T) {
	tests := []struct {
		name string
		text string
		want LoadSample
	}{
		{
			name: "vLLM v1 engine label: counts add, usage averages",
			text: `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
vllm:num_requests_running{engine="1",model_name="m"} 4
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="1",model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
`,
			want: LoadSample{KVUsage: 0.4, KVKnown: true, Running: 7, Waiting: 3, LoraRunning: []string{}, LoraWaiting: []string{}},
		},
		{
			name: "older vLLM gpu_cache_usage_perc",
			text: `vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:num_requests_running{model_name="m"} 1
`,
			want: LoadSample{KVUsage: 0.5, KVKnown: true, Running: 1, LoraRunning: []string{}, LoraWaiting: []string{}},
		},
		{
			name: "lora: only the newest series counts",
			text: `vllm:num_requests_running 1
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old-a,old-b",waiting_lora_adapters="old-c"} 1.7e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="new-a",waiting_lora_adapters=""} 1.700000002e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="mid",waiting_lora_adapters="mid-w"} 1.700000001e+09
`,
			want: LoadSample{KVKnown: false, Running: 1, LoraRunning: []string{"new-a"}, LoraWaiting: []string{}, MaxLora: 4},
		},
		{
			name: "lora: union of the series sharing the newest value",
			text: `vllm:num_requests_running 3
vllm:lora_requests_info{engine="0",max_lora="2",running_lora_adapters="b,a",waiting_lora_adapters=""} 1.700000002e+09
vllm:lora_requests_info{engine="1",max_lora="2",running_lora_adapters="c",waiting_lora_adapters="a, d"} 1.700000002e+09
vllm:lora_requests_info{engine="0",max_lora="2",running_lora_adapters="stale",waiting_lora_adapters="stale"} 1.7e+09
`,
			want: LoadSample{Running: 3, LoraRunning: []string{"a", "b", "c"}, LoraWaiting: []string{"a", "d"}, MaxLora: 2},
		},
		{
			name: "vllm: the batch size from a config-info series",
			text: `vllm:num_requests_running 1
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1
vllm:scheduler_config_info{engine="0",max_num_seqs="128"} 1
vllm:scheduler_config_info{engine="1",max_num_seqs="128"} 1
`,
			want: LoadSample{Running: 1, LoraRunning: []string{}, LoraWaiting: []string{}, MaxBatch: 256, KVBlocks: 2048, BlockSize: 16},
		},
		{
			name: "lora: a tie is resolved by the engine's counts",
			text: `vllm:num_requests_running 1
vllm:num_requests_waiting 0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.700000002e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="b",waiting_lora_adapters="a"} 1.700000002e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 1.700000002e+09
`,
			want: LoadSample{Running: 1, LoraRunning: []string{"a"}, LoraWaiting: []string{}, MaxLora: 2},
		},
		{
			name: "lora: an idle engine runs no adapter, tie or not",
			text: `vllm:num_requests_running 0
vllm:num_requests_waiting 0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 1.700000002e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,c",waiting_lora_adapters="b"} 1.700000002e+09
`,
			want: LoadSample{LoraRunning: []string{}, LoraWaiting: []string{}, MaxLora: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, as, err := ParseMetrics(FlavorAuto, strings.NewReader(tt.text))
			if err != nil {
				t.Fatal(err)
			}
			if as != FlavorVLLM {
				t.Errorf("read as %q", as)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("sample\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseMetricsErrors(t *testing.T) {
	if _, _, err := ParseMetrics(FlavorAuto, strings.NewReader("process_cpu_seconds_total 3\n")); !errors.Is(err, ErrNoLoadMetrics) {
		t.Errorf("auto on foreign metrics: err %v, want ErrNoLoadMetrics", err)
	}
	f, err := os.Open("testdata/tgi/metrics-from-source.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := ParseMetrics(FlavorVLLM, f); !errors.Is(err, ErrNoLoadMetrics) {
		t.Errorf("vllm flavor on TGI metrics: err %v, want ErrNoLoadMetrics", err)
	}
	if _, _, err := ParseMetrics(FlavorVLLM, strings.NewReader("{{{ not metrics")); err == nil {
		t.Error("garbage parsed without error")
	}
}

func TestSlotUsage(t *testing.T) {
	f, err := os.Open("testdata/llamacpp/slots-docs-example.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, n, err := slotUsage(f)
	if err != nil {
		t.Fatal(err)
	}
	if got != 1 || n != 2 {
		t.Errorf("slot usage %v of %d slots, want 1 of 2 (both slots processing)", got, n)
	}
	got, n, err = slotUsage(strings.NewReader(`[{"id":0,"is_processing":true},{"id":1,"is_processing":false},{"id":2},{"id":3}]`))
	if err != nil || got != 0.25 || n != 4 {
		t.Errorf("slot usage %v of %d, %v; want 0.25 of 4", got, n, err)
	}
	if _, _, err := slotUsage(strings.NewReader(`[]`)); err == nil {
		t.Error("no slots: want an error")
	}
}

func TestEstimateKV(t *testing.T) {
	s := LoadSample{Running: 21}
	estimateKV(&s, 42)
	if s.KVUsage != 0.5 {
		t.Errorf("estimate %v, want 0.5", s.KVUsage)
	}
	s = LoadSample{Running: 100}
	estimateKV(&s, 42)
	if s.KVUsage != 1 {
		t.Errorf("estimate %v, want capped at 1", s.KVUsage)
	}
	s = LoadSample{KVUsage: 0.3, KVKnown: true, Running: 100}
	estimateKV(&s, 42)
	if s.KVUsage != 0.3 {
		t.Errorf("a known KV usage was overwritten: %v", s.KVUsage)
	}
}
