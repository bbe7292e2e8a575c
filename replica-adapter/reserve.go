package adapter

import (
	"bytes"
	"net"
	"net/http"
	"strconv"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// answerBounds is what the adapter enforces on the body of one inference
// endpoint, whatever path the body took to it.
type answerBounds struct {
	// maxTokens names the body fields that bound the answer's length; the
	// first is written when the body has none. The reserved max_tokens
	// (Llm-Max-Tokens) is written into every one of them.
	maxTokens []string
	// choices: the body may ask for several answers (n, best_of), which
	// the reservation does not cover.
	choices bool
}

// answerLimits is each endpoint's length fields, beside forwardable, the
// list of what reaches the engine at all: a new inference endpoint gets its
// case here too.
func answerLimits(endpoint string) answerBounds {
	switch endpoint {
	case subjects.EndpointChat:
		return answerBounds{maxTokens: []string{"max_tokens", "max_completion_tokens"}, choices: true}
	case subjects.EndpointCompletions:
		return answerBounds{maxTokens: []string{"max_tokens"}, choices: true}
	case subjects.EndpointResponses:
		return answerBounds{maxTokens: []string{"max_output_tokens"}}
	case subjects.EndpointMessages:
		return answerBounds{maxTokens: []string{"max_tokens"}}
	}
	return answerBounds{} // embeddings: no answer to bound
}

// engineBody is the body sent to the engine, as the parts that make it
// (setParts): the model set to the served name, and the reserved
// max_tokens written in, whatever the body said. A
// body asking for more than one answer is refused: the quota reserved one.
func engineBody(ep answerBounds, body []byte, model, reservedMax string, extra ...bodyField) (net.Buffers, *subjects.APIError) {
	quoted, _ := quote(model)
	fields := append([]bodyField{{keys: []string{"model"}, value: quoted}}, extra...)
	if reservedMax != "" && len(ep.maxTokens) > 0 {
		n, err := strconv.Atoi(reservedMax)
		if err != nil || n < 1 || n > features.MaxTokensLimit {
			return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest,
				subjects.HdrMaxTokens+" must be an integer from 1 to "+strconv.Itoa(features.MaxTokensLimit))
		}
		fields = append(fields, bodyField{keys: ep.maxTokens, value: []byte(strconv.Itoa(n))})
	}
	var watch []string
	if ep.choices {
		watch = []string{"n", "best_of"}
	}
	out, answers, err := setParts(body, fields, watch...)
	if err != nil {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, err.Error())
	}
	for _, v := range answers {
		if !bytes.Equal(v, []byte("1")) && !bytes.Equal(v, []byte("null")) {
			return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest,
				"n and best_of must be 1: a request asks for one answer")
		}
	}
	return out, nil
}
